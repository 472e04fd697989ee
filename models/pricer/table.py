"""The ``vector-table`` data model: PriCER's vectors x_i ∈ R^d read from a CSV or parquet file.

One row per node: an ``agent`` column (numbers or text; the nodes are the distinct ids in
sorted order, as in the ``table`` model, so a graph file's node ids are matched to them) and the
coordinates of x_i in the columns named by `columns` (by default every other column, in the
file's order). The vectors are fixed for the whole run, as in the ``vectors`` model: every slot
is one round of estimating x̄ = (1/n) Σ_i x_i, every agent's truth.

R, the bound on every ‖x_i‖₂ that calibrates the privacy noise, is a field of the study
(`radius`), never read from the data: a bound computed from the vectors would itself depend on
every node's data. A vector longer than R is refused, or with ``clip = "scale"`` scaled to norm
R (norm clipping, as DP-SGD clips gradients: Abadi et al. 2016), and the run says how many.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from desim.kernel.fingerprint import sha256_file
from desim.kernel.params import param
from desim.kernel.registry import DATA
from desim.models.pricer.data import VectorSamples
from desim.models.table import FORMATS, column_names, numeric_column, record_batches


class ClippedWarning(UserWarning):
    """Vectors of a file longer than R, scaled to norm R (``clip = "scale"``)."""


@DATA.register("vector-table")
@dataclass(frozen=True)
class VectorTable:
    """PriCER's vectors read from a CSV or parquet `file`: one row per node, an ``agent``
    column and the coordinates (`columns`), each vector within the public bound `radius`."""

    file: str = param("", "CSV or parquet file, relative to the study folder")
    radius: float = param(0.0, "R, the public bound on every ‖x_i‖₂ (set it: never from the data)")
    columns: list[str] | None = param(
        None, "the coordinate columns, in order (default: every column but agent)"
    )
    clip: Literal["refuse", "scale"] = param(
        "refuse", "a vector longer than R: refuse the file, or scale it to norm R"
    )
    sha256: str = param("", "sha256 of the file, set by desim when a study is expanded")

    def __post_init__(self) -> None:
        if not self.file:
            raise ValueError("file = '': name the CSV or parquet file of the nodes' vectors")
        if Path(self.file).suffix.lower() not in FORMATS:
            raise ValueError(
                f"file = {self.file!r}: allowed extensions: {', '.join(sorted(FORMATS))}"
            )
        if not self.radius > 0:
            raise ValueError(
                f"radius = {self.radius}: set R > 0, the public bound on every ‖x_i‖₂ (the "
                "privacy noise is calibrated to it, so it cannot be read from the data)"
            )
        if self.columns is not None and (not self.columns or "agent" in self.columns):
            raise ValueError(
                f"columns = {self.columns!r}: name one or more coordinate columns (not 'agent')"
            )

    def make(self, rng: np.random.Generator) -> VectorTableSamples:
        """Read the file (no draws from `rng`) and return the data source."""
        path = Path(self.file)
        if self.sha256 and sha256_file(path) != self.sha256:
            raise ValueError(f"file {path.name!r} changed since the study was expanded; run again")
        ids, x = read_vectors(path, self.columns)
        norms = np.linalg.norm(x, axis=1)
        long = np.flatnonzero(norms > self.radius)
        if len(long):
            worst = int(long[np.argmax(norms[long])])
            what = (
                f"{path.name}: {len(long)} of {len(ids)} vectors are longer than radius = "
                f"{self.radius} (longest: agent {ids[worst]!r}, norm {norms[worst]:.6g})"
            )
            if self.clip == "refuse":
                raise ValueError(f"{what}: raise radius, or clip = 'scale' to scale them to R")
            x[long] *= (self.radius / norms[long])[:, None]
            warnings.warn(f"{what}; scaled to norm R", ClippedWarning, stacklevel=2)
        return VectorTableSamples(self, ids, x)


def read_vectors(path: Path, columns: list[str] | None) -> tuple[list, np.ndarray]:
    """(the agent ids in sorted order, the n × d matrix of their vectors in that order) of the
    file `path`; `ValueError` (one line naming the file and the column) for a missing or
    non-numeric column, NaN or infinite values, or an agent with more than one row."""
    name = path.name
    names = column_names(path)
    if "agent" not in names:
        shown = ", ".join(map(repr, names[:10]))
        raise ValueError(f"{name}: missing column 'agent'; the columns are {shown}")
    wanted = [c for c in names if c != "agent"] if columns is None else list(columns)
    missing = [c for c in wanted if c not in names]
    if missing or not wanted:
        what = f"column {missing[0]!r}" if missing else "coordinate columns (only 'agent')"
        raise ValueError(f"{name}: missing {what}; the columns are {', '.join(map(repr, names))}")
    ids: list = []
    blocks: list[np.ndarray] = []
    rows = 0
    for batch in record_batches(path, ["agent", *wanted]):
        agent = batch.column("agent")
        if agent.null_count:
            raise ValueError(f"{name}: column 'agent' has {agent.null_count} empty values")
        ids.extend(agent.to_pylist())
        blocks.append(
            np.column_stack([numeric_column(batch.column(c), c, name, rows) for c in wanted])
        )
        rows += batch.num_rows
    if not rows:
        raise ValueError(f"{name}: no rows")
    x = np.concatenate(blocks)
    order = sorted(range(len(ids)), key=lambda i: ids[i])
    ids = [ids[i] for i in order]
    twice = next((a for a, b in zip(ids, ids[1:], strict=False) if a == b), None)
    if twice is not None:
        raise ValueError(f"{name}: agent {twice!r} has more than one row (one vector per node)")
    return ids, x[order]


class VectorTableSamples(VectorSamples):
    """The data source of one run of `VectorTable`: the same x_i every slot, truth x̄ for all;
    `public["agent_ids"]` names the nodes (for a graph file's node ids)."""

    def __init__(self, spec: VectorTable, ids: list, x: np.ndarray) -> None:
        self.spec = spec
        self.ids = list(ids)
        self._set(x)

    def _set(self, x: np.ndarray) -> None:
        self.x = np.ascontiguousarray(x)
        self.x.flags.writeable = False
        self.n_agents, dimension = x.shape
        self.classes = np.zeros(self.n_agents, dtype=np.int64)
        self.means = np.broadcast_to(x.mean(axis=0), x.shape)
        self.public = {
            "R": self.spec.radius,
            "d": dimension,
            "agent_ids": list(self.ids),
            "agent_index": {agent: i for i, agent in enumerate(self.ids)},
        }

    def restrict(self, kept: np.ndarray) -> None:
        """Keep only the nodes numbered `kept` (increasing), renumbered 0, 1, …: the others
        leave the run (e.g. nodes of no graph file node, `unmatched = "drop"`); x̄ is then the
        mean over the nodes kept."""
        self.ids = [self.ids[i] for i in kept]
        self._set(self.x[kept])
