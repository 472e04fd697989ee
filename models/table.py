"""The ``table`` data model: every agent's stream of samples read from a CSV or parquet file.

The file (relative to the study folder, never reached through a link out of it) has an
``agent`` column and a ``value`` column, and optionally ``order`` (time: each agent's samples
are taken in increasing order, ties in file order; without it, in file order), ``class`` (the
agents' classes, for the oracle baselines and class metrics) and ``truth`` (each agent's true
mean, constant per agent). The agents are the distinct ids of the ``agent`` column in sorted
order; ``public["agent_index"]`` maps each id to its agent number (for matching a graph later).

Truth (what the MSE is scored against): ``truth = "mean"`` (the default) is each agent's mean
over all its rows; ``truth = "column"`` reads the ``truth`` column. When an agent's rows run
out, ``exhausted`` says what it samples next: ``"cycle"`` (the default) starts its rows again,
``"resample"`` draws its rows uniformly with replacement from the run's ``data`` stream, and
``"stop"`` refuses a horizon longer than the shortest stream (the engine gives every agent a
sample every slot: it has no "no new sample", so stopping early cannot be expressed).

Public facts: ``L`` is half the range of all values (two samples differ by at most 2L), and
``sigma2`` each agent's variance over all its rows (the known-variance setting).
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from desim.kernel.params import param
from desim.kernel.protocol import DataSource
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
        "cycle", "when an agent's rows run out: start again, resample them, or stop (refused)"
    )
    sha256: str = param("", "sha256 of the file, set by desim when a study is expanded")

    def __post_init__(self) -> None:
        if not self.file:
            raise ValueError("file = '': name the CSV or parquet file of the agents' samples")
        if Path(self.file).suffix.lower() not in FORMATS:
            raise ValueError(
                f"file = {self.file!r}: allowed extensions: {', '.join(sorted(FORMATS))}"
            )

    def make(self, rng: np.random.Generator) -> TableSamples:
        """Read the file (no draws from `rng`) and return the data source."""
        path = Path(self.file)
        if self.sha256 and _sha256(path) != self.sha256:
            raise ValueError(f"file {path.name!r} changed since the study was expanded; run again")
        return TableSamples(self, read_table(path, self.truth == "column"))


def _sha256(path: Path) -> str:
    """sha256 (hex) of the bytes of `path`, as the study layer fingerprints the file."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


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
    column) for a file that is empty, not its extension's type, or holds bad rows."""
    columns = _read_columns(path, with_truth)
    name = path.name
    agent = columns.pop("agent")
    ids, codes = _agent_codes(agent, name)
    del agent
    n = len(ids)
    key = columns.pop("order", None)
    # stable: rows of one agent (at one time) keep their file order
    perm = np.argsort(codes, kind="stable") if key is None else np.lexsort((key, codes))
    del key
    length = np.bincount(codes, minlength=n)
    del codes
    start = np.concatenate([[0], np.cumsum(length)[:-1]])
    values = np.take(columns.pop("value"), perm)  # the file's order freed once taken
    out = AgentRows(ids, values, start, length, None, None)
    if columns:  # class and truth: one value per agent, checked on the rows in agent order
        sorted_codes = np.repeat(np.arange(n, dtype=np.int32), length)
        if "class" in columns:
            _, labels = _agent_codes(columns.pop("class"), name, "class")
            out.classes = _per_agent(labels[perm], sorted_codes, out, name, "class")
        if with_truth:
            out.truth = _per_agent(columns.pop("truth")[perm], sorted_codes, out, name, "truth")
    return out


def _read_columns(path: Path, with_truth: bool) -> dict[str, np.ndarray]:
    """The columns of `COLUMNS` present in the file, as numpy arrays (agent and class as
    read; the others float64, finite)."""
    name = path.name
    kind = FORMATS[path.suffix.lower()]
    _check_head(path, kind)
    try:
        table = _arrow_table(path, kind)
    except Exception as exc:  # pyarrow's own errors have no common base to catch
        what = " ".join(str(exc).split())[:160]
        raise ValueError(f"{name}: cannot be read as {kind}: {what}") from None
    missing = [c for c in ("agent", "value") if c not in table.column_names]
    if missing:
        raise ValueError(
            f"{name}: missing column {missing[0]!r}; the columns are "
            f"{', '.join(map(repr, table.column_names[:10]))}"
        )
    out = {}
    wanted = [c for c in COLUMNS if c in table.column_names and (c != "truth" or with_truth)]
    for column in wanted:
        chunked = table.column(column)
        table = table.drop_columns([column])  # each column held once: arrow's or numpy's
        out[column] = _numeric(chunked, column, name) if column in _NUMERIC else chunked
    if with_truth and "truth" not in out:
        raise ValueError(f"{name}: truth = 'column' but the file has no 'truth' column")
    return out


def _arrow_table(path: Path, kind: str):
    """The file's columns of `COLUMNS` as a pyarrow table (numeric columns as float64)."""
    import pyarrow as pa

    if kind == "parquet":
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        return pq.read_table(path, columns=[c for c in COLUMNS if c in names])
    from pyarrow import csv as pacsv

    names = _csv_names(path)
    reader = pacsv.open_csv(
        path,
        # small blocks, read one at a time: what the reader holds beside the columns stays small
        read_options=pacsv.ReadOptions(use_threads=False, block_size=_BLOCK),
        convert_options=pacsv.ConvertOptions(
            include_columns=[c for c in COLUMNS if c in names],
            column_types={c: pa.float64() for c in _NUMERIC if c in names},
            null_values=[""],  # "nan" stays a number, refused as NaN by name
        ),
        memory_pool=pa.system_memory_pool(),  # arrow's buffers go back once converted
    )
    blocks = {n: [] for n in reader.schema.names}
    for batch in reader:
        for n, arrays in blocks.items():
            arrays.append(batch.column(n))
    return pa.table(
        {n: pa.chunked_array(a, type=reader.schema.field(n).type) for n, a in blocks.items()}
    )


def agent_counts(path: Path) -> tuple[list, np.ndarray]:
    """(the distinct agent ids of the file `path` in sorted order, rows per agent), read from
    the agent column alone in blocks (cheap: what the study's size estimates and graph
    matching need before the file is read whole); `ValueError` as `read_table`."""
    stat = path.stat()
    return _agent_counts(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _agent_counts(path: str, size: int, mtime_ns: int) -> tuple[list, np.ndarray]:
    import pyarrow as pa
    import pyarrow.compute as pc

    file = Path(path)
    values, counts = [], []
    for batch in _batches(file, ["agent"]):
        agent = batch.column(0)
        if pa.types.is_dictionary(agent.type):
            agent = agent.cast(agent.type.value_type)
        if agent.null_count:
            raise ValueError(f"{file.name}: column 'agent' has empty values")
        tally = pc.value_counts(agent)
        values.append(tally.field("values"))
        counts.append(tally.field("counts").to_numpy())
    if not values:
        raise ValueError(f"{file.name}: no rows")
    every = pa.concat_arrays(values)
    ids = pc.unique(every)
    ids = ids.take(pc.sort_indices(ids))
    where = pc.index_in(every, value_set=ids).to_numpy()
    rows = np.bincount(where, weights=np.concatenate(counts), minlength=len(ids))
    return ids.to_pylist(), rows.astype(np.int64)


def _batches(path: Path, columns: list[str]):
    """The file's `columns` (those present) in record batches of about `_BLOCK` bytes of text
    or one parquet row group's batches: never the whole file at once."""
    import pyarrow as pa

    kind = FORMATS[path.suffix.lower()]
    _check_head(path, kind)
    if kind == "parquet":
        import pyarrow.parquet as pq

        handle = pq.ParquetFile(path)
        names = handle.schema_arrow.names
        yield from handle.iter_batches(
            batch_size=1 << 16, columns=[c for c in columns if c in names]
        )
        return
    from pyarrow import csv as pacsv

    names = _csv_names(path)
    yield from pacsv.open_csv(
        path,
        read_options=pacsv.ReadOptions(use_threads=False, block_size=_BLOCK),
        convert_options=pacsv.ConvertOptions(
            include_columns=[c for c in columns if c in names],
            column_types={c: pa.float64() for c in _NUMERIC if c in names and c in columns},
            null_values=[""],
        ),
        memory_pool=pa.system_memory_pool(),
    )


def _csv_names(path: Path) -> list[str]:
    """The column names of CSV file `path` (its first line)."""
    with open(path, "rb") as f:
        header = f.readline().decode("utf-8").strip().split(",")
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


#: Bytes of a CSV file parsed at once.
_BLOCK = 1 << 20


def _numeric(chunked, column: str, name: str) -> np.ndarray:
    """A numeric column as float64 numpy, refused when it has empty or non-finite values."""
    import pyarrow as pa

    if not (pa.types.is_floating(chunked.type) or pa.types.is_integer(chunked.type)):
        raise ValueError(f"{name}: column {column!r} is not numeric (type {chunked.type})")
    if chunked.null_count:
        raise ValueError(f"{name}: column {column!r} has {chunked.null_count} empty values")
    values = np.asarray(chunked.to_numpy(), dtype=float)
    del chunked
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(
            f"{name}: column {column!r} has {int(bad.sum())} NaN or infinite values "
            f"(first at data row {int(np.argmax(bad)) + 1})"
        )
    return values


def _agent_codes(agent, name: str, column: str = "agent") -> tuple[list, np.ndarray]:
    """(the distinct ids of an id column in sorted order, each row's number among them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if agent.null_count:
        raise ValueError(f"{name}: column {column!r} has {agent.null_count} empty values")
    if pa.types.is_dictionary(agent.type):  # e.g. a pandas categorical written to parquet
        used = set(pc.unique(agent.cast(agent.type.value_type)).to_pylist())
        categories = {v for chunk in agent.chunks for v in chunk.dictionary.to_pylist()}
        unused = sorted(categories - used, key=str)
        if unused:
            raise ValueError(f"{name}: {column} {unused[0]!r} has no rows (of {len(unused)})")
        agent = agent.cast(agent.type.value_type)
    ids = pc.unique(agent)
    ids = ids.take(pc.sort_indices(ids))
    codes = pc.index_in(agent, value_set=ids)
    return ids.to_pylist(), np.asarray(codes.to_numpy(), dtype=np.int32)


def _per_agent(
    values: np.ndarray, codes: np.ndarray, streams: AgentRows, name: str, column: str
) -> np.ndarray:
    """A per-agent column (class or truth, rows in agent order) as one value per agent,
    refused unless it is constant over each agent's rows."""
    one = values[streams.start]
    differs = one[codes] != values
    if differs.any():
        agent = streams.ids[int(codes[np.argmax(differs)])]
        raise ValueError(
            f"{name}: column {column!r} differs within agent {agent!r}; "
            "it must be one value per agent"
        )
    return one


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
            self.spec.exhausted, "stop"
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
        else:  # stop: `check_run` keeps runs within the shortest stream; past it, never read
            row = np.minimum(t, length - 1)
        x = s.values[s.start[None, :] + row]
        if self.spec.exhausted == "stop":
            x[~inside] = np.nan
        return x

    def check_run(self, protocol, metrics: tuple[str, ...], t_max: int) -> None:
        """Raise `ValueError` (one line) when a run of `t_max` slots of `protocol` with
        `metrics` needs what the file does not give: classes, or rows beyond its end."""
        name = Path(self.spec.file).name
        needs = [m for m in metrics if m in CLASS_METRICS]
        if not self.has_classes and (protocol.uses_oracle or needs):
            who = f"metric {needs[0]!r}" if needs else "this protocol (it sees the classes)"
            raise ValueError(
                f"{name}: {who} needs the agents' classes: add a 'class' column to the file"
            )
        shortest = int(self.streams.length.min())
        if self.spec.exhausted == "stop" and t_max > shortest:
            agent = self.streams.ids[int(np.argmin(self.streams.length))]
            raise ValueError(
                f"exhausted = 'stop': agent {agent!r} has {shortest} rows but t_max = {t_max}; "
                "every agent needs a sample each slot: use 'cycle' or 'resample', or a shorter "
                "t_max"
            )
