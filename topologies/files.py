"""Graphs read from files: an edge list, GraphML, or a county adjacency file (the US Census
layout), registered as the ``file`` topology.

Agents meet nodes in one of two ways. A data model that names its agents (``public["agent_ids"]``,
e.g. the ``table`` model's agent column) has them matched to the file's node ids: ids compare
as integers when both are written as integers (so the FIPS code ``01001`` is county 1001) and as
text otherwise. `unmatched` says what becomes of an agent with no node: ``"isolate"`` keeps it
with no neighbours, ``"drop"`` removes it from the run; nodes with no agent are dropped; both
are reported (`GraphMatchWarning`, kept in each run's sidecar). A file none of whose ids is an
agent's is refused. A synthetic population has agents 0…M−1: an edge list names them by number
and GraphML nodes are taken in file order (there must be exactly M).

``format = "county-adjacency"`` without a path reads the bundled US county adjacency
(`COUNTIES`: 3,232 counties and equivalents by 5-digit FIPS code, 9,476 links; see
topologies/data/PROVENANCE.md).
"""

from __future__ import annotations

import functools
import gzip
import re
import warnings
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from desim.kernel.fingerprint import sha256_file
from desim.kernel.params import param
from desim.kernel.registry import TOPOLOGIES
from desim.topologies.generators import Topology, TopologyWarning, _nx
from desim.topologies.graph import Graph

#: The bundled US county adjacency (Census layout, symmetrised, gzip-compressed).
COUNTIES = Path(__file__).parent / "data" / "county_adjacency.txt.gz"
#: How many unmatched ids a report names.
SHOWN = 5


class GraphMatchWarning(TopologyWarning):
    """Agents with no node in a graph file, or nodes with no agent: what was done with them."""


@TOPOLOGIES.register("file")
@dataclass(frozen=True)
class FromFile(Topology):
    """A fixed graph read from a file: an edge list ("u v" per line), GraphML or a county
    adjacency file, its nodes matched to the agents' ids.

    Edge lists: lines starting with # are comments, a third column such as a weight is
    ignored, both "u v" and "v u" may appear. A relative path in a study file is relative to
    the study folder.
    """

    path: str = param("", "the graph file (none: the bundled US county adjacency)")
    format: Literal["auto", "edgelist", "graphml", "county-adjacency"] = param(
        "auto", "file format; auto: GraphML for .graphml and .xml, otherwise an edge list"
    )
    unmatched: Literal["isolate", "drop"] = param(
        "isolate", "an agent with no node: keep it with no neighbours, or drop it from the run"
    )
    sha256: str = param("", "sha256 of the file, set by desim when a study is expanded")

    def __str__(self) -> str:
        # what warnings name: the file, never the absolute path the run reads it from
        return f"graph file {Path(self.path).name if self.path else COUNTIES.name!r}"

    def file(self) -> Path:
        """The file read: `path`, or the bundled county adjacency."""
        if not self.path and self.format == "county-adjacency":
            return COUNTIES
        if not self.path:
            raise ValueError("path is required (the graph file)")
        return Path(self.path)

    def kind(self) -> str:
        """The format, `format` or (for auto) the one the file's extension names."""
        if self.format != "auto":
            return self.format
        return "graphml" if self.file().suffix.lower() in (".graphml", ".xml") else "edgelist"

    def _checked(self) -> Path:
        file = self.file()
        if not file.is_file():
            raise ValueError(f"path = {self.path!r}: no such file")
        if file.stat().st_size == 0:
            raise ValueError(f"path = {self.path!r}: the file is empty")
        if self.sha256 and sha256_file(file) != self.sha256:
            raise ValueError(f"{file.name}: changed since the study was expanded; run again")
        return file

    def check(self, n: int) -> None:
        self._numbered(n)

    def make(self, n: int, rng: np.random.Generator) -> Graph:
        u, v = self._numbered(n)
        return Graph.from_edges(n, u, v)

    def _numbered(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The links of a population numbered 0…M−1 (no agent ids)."""
        file, kind = self._checked(), self.kind()
        if kind == "county-adjacency":
            raise ValueError(
                f"{file.name}: format = 'county-adjacency' names counties: the data must name "
                "its agents ([data] model = 'table' with an agent column of FIPS codes)"
            )
        if kind == "graphml":
            return _read_graphml(file, n)
        return _read_edgelist(file, n)

    def build_on(self, data: Any, rng: np.random.Generator) -> Graph:
        """The graph of a run on `data`: its agent ids matched to the file's node ids (an
        agent with no node dropped from `data` with ``unmatched = "drop"``), or, for a
        population without ids, `build`."""
        ids = data.public.get("agent_ids")
        if ids is None:
            return self.build(data.n_agents, rng)
        file = self._checked()
        match = match_nodes(read_graph(file, self.kind()), ids, self.unmatched, file.name)
        if match.report:
            warnings.warn(match.report, GraphMatchWarning, stacklevel=2)
        if len(match.kept) < len(ids):
            restrict = getattr(data, "restrict", None)
            if restrict is None:
                raise ValueError(f"{file.name}: unmatched = 'drop': this data cannot drop agents")
            restrict(match.kept)
        graph = Graph.from_edges(len(match.kept), match.u, match.v)
        return self.warn_if_disconnected(graph)


def build_graph(topology: Any, data: Any, rng: np.random.Generator) -> Graph:
    """The graph of a run: the topology's own `build_on(data, rng)` when it matches nodes to
    the data's agents (a graph file), else `topology.build(data.n_agents, rng)`."""
    on_data = getattr(topology, "build_on", None)
    if on_data is not None:
        return on_data(data, rng)
    return topology.build(data.n_agents, rng)


# --------------------------------------------------------------------------------------------
# files read with node ids


@dataclass(frozen=True)
class GraphFile:
    """A graph as a file gives it: node ids (text, in order of first appearance) and its
    links as pairs of node numbers (u[i], v[i])."""

    nodes: tuple[str, ...]
    u: np.ndarray
    v: np.ndarray


def read_graph(file: Path, kind: str) -> GraphFile:
    """The nodes and links of graph `file` in format `kind`; `ValueError` (one line naming the
    file) for a file that is not what `kind` says or has a bad line."""
    stat = file.stat()
    return _read_graph(str(file.resolve()), kind, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_graph(path: str, kind: str, size: int, mtime_ns: int) -> GraphFile:
    file = Path(path)
    try:
        return _parse_graph(file, kind)
    except (EOFError, gzip.BadGzipFile, zlib.error):
        raise ValueError(f"{file.name}: a damaged gzip file (it cannot be uncompressed)") from None


def _parse_graph(file: Path, kind: str) -> GraphFile:
    head = _head(file)
    looks_xml = head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<")
    if kind == "graphml":
        if not looks_xml:
            raise ValueError(f"{file.name}: not a GraphML file (it does not start with '<')")
        return _graphml_ids(file)
    if looks_xml:
        raise ValueError(f"{file.name}: looks like XML (GraphML?): set format = 'graphml'")
    nodes: dict[str, int] = {}
    u: list[int] = []
    v: list[int] = []
    reader = _county_lines if kind == "county-adjacency" else _edge_lines
    try:
        with _open_text(file) as fh:
            reader(fh, file.name, nodes, u, v)
    except UnicodeDecodeError:  # binary, UTF-16, Latin-1: never echo the bytes
        raise ValueError(f"{file.name}: {_NOT_TEXT}") from None
    if not u:
        raise ValueError(f"{file.name}: no links (only comments, blank lines or self-pairs)")
    return GraphFile(tuple(nodes), np.array(u, dtype=np.int64), np.array(v, dtype=np.int64))


def _head(file: Path) -> bytes:
    """The first bytes of `file`, uncompressed when it is gzip."""
    with file.open("rb") as fh:
        head = fh.read(512)
    if head[:2] == _GZIP:
        with gzip.open(file, "rb") as fh:
            head = fh.read(512)
    elif file.suffix.lower() == ".gz":
        raise ValueError(f"{file.name}: not a gzip file (it does not start with 1f 8b)")
    return head


def _open_text(file: Path):
    """`file` as UTF-8 text lines (a gzip file uncompressed)."""
    with file.open("rb") as fh:
        gz = fh.read(2) == _GZIP
    if gz:
        return gzip.open(file, "rt", encoding="utf-8", newline="")
    return file.open(encoding="utf-8", newline="")


_GZIP = b"\x1f\x8b"
_NOT_TEXT = "not UTF-8 text; an edge list must be a UTF-8 text file"


def _node(nodes: dict[str, int], name: str) -> int:
    return nodes.setdefault(name, len(nodes))


def _edge_fields(fh: Iterable[str], name: object) -> Iterator[tuple[int, str, list[str]]]:
    """(line number, line, its fields) of every line of an edge list that holds something:
    # starts a comment, commas count as spaces, a NUL byte is refused."""
    for lineno, line in enumerate(fh, start=1):
        if "\x00" in line:  # UTF-16 text or a binary file may decode, but is no edge list
            raise ValueError(f"{name}:{lineno}: {_NOT_TEXT}")
        text = line.split("#", 1)[0].replace(",", " ").split()
        if text:
            yield lineno, line, text


def _edge_lines(fh, name: str, nodes: dict[str, int], u: list[int], v: list[int]) -> None:
    """Read an edge list with node ids: "a b" per line, # comments, commas as spaces."""
    for lineno, line, text in _edge_fields(fh, name):
        if len(text) < 2:
            raise ValueError(f"{name}:{lineno}: {_shown(line)}: expected two node ids")
        if text[0] == text[1]:
            raise ValueError(f"{name}:{lineno}: self-loop {text[0]}–{text[1]}: G has none")
        u.append(_node(nodes, text[0]))
        v.append(_node(nodes, text[1]))


def _county_lines(fh, name: str, nodes: dict[str, int], u: list[int], v: list[int]) -> None:
    """Read a county adjacency file: "county, FIPS, neighbour, FIPS" separated by tabs (the
    2010 and 2020 Census files) or "|" (2023), the county's fields empty after its first
    line; a county listed as its own neighbour is a node with no link."""
    county = ""
    for lineno, line in enumerate(fh, start=1):
        if "\x00" in line:
            raise ValueError(f"{name}:{lineno}: {_NOT_TEXT}")
        if not line.strip():
            continue
        fields = [f.strip().strip('"') for f in re.split(r"[\t|]", line.rstrip("\r\n"))]
        if len(fields) != 4:
            raise ValueError(
                f"{name}:{lineno}: {_shown(line)}: expected 4 fields (county, FIPS, neighbour, "
                "FIPS) separated by tabs or '|'"
            )
        if lineno == 1 and fields[0].lower() == "county name":  # the 2023 file's header
            continue
        county = fields[1] or county
        if not county or not fields[3]:
            raise ValueError(f"{name}:{lineno}: {_shown(line)}: a FIPS code is missing")
        a, b = _node(nodes, county), _node(nodes, fields[3])
        if a != b:
            u.append(a)
            v.append(b)


def _shown(line: str) -> str:
    text = line.strip()
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _graphml_ids(file: Path) -> GraphFile:
    try:
        g = _nx().read_graphml(file)
    except Exception as exc:  # networkx raises several parser errors; report any of them
        raise ValueError(f"{file.name}: not readable GraphML: {_shown(str(exc))}") from None
    if _nx().number_of_selfloops(g):
        raise ValueError(f"{file.name}: has self-loops; G has none")
    index = {node: i for i, node in enumerate(g.nodes())}
    pairs = np.array([(index[a], index[b]) for a, b in g.edges()], dtype=np.int64).reshape(-1, 2)
    if not len(pairs):
        raise ValueError(f"{file.name}: no links")
    return GraphFile(tuple(str(node) for node in g.nodes()), pairs[:, 0], pairs[:, 1])


# --------------------------------------------------------------------------------------------
# nodes matched to agents


@dataclass(frozen=True)
class Match:
    """Agents matched to a graph file's nodes: `kept` the agents of the run (numbers among
    the data's), its links (u[i], v[i]) among them, and the `report` of what did not match
    ('' when everything did)."""

    kept: np.ndarray
    u: np.ndarray
    v: np.ndarray
    report: str
    agents_without: tuple
    nodes_without: tuple[str, ...]


_INTEGER = re.compile(r"[+-]?\d+")


def id_key(x: Any) -> Any:
    """What an id is compared by: an integer when written as one, otherwise its text."""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int | np.integer):
        return int(x)
    if isinstance(x, float | np.floating) and float(x).is_integer():
        return int(x)
    text = str(x).strip()
    return int(text) if _INTEGER.fullmatch(text) else text


def match_nodes(graph: GraphFile, ids: list, unmatched: str, name: str) -> Match:
    """Match the agents `ids` to `graph`'s node ids (`id_key`); `ValueError` when no node is
    an agent or two ids of one side compare equal (e.g. 7 and 007)."""
    agent_of = _unique_keys(ids, "agent", name)
    node_keys = [id_key(node) for node in graph.nodes]
    _unique_keys(graph.nodes, "node", name)
    agent = np.array([agent_of.get(k, -1) for k in node_keys], dtype=np.int64)
    if not (agent >= 0).any():
        raise ValueError(
            f"{name}: no node id matches an agent id (nodes: {_first(graph.nodes)}; "
            f"agents: {_first(ids)})"
        )
    has_node = np.zeros(len(ids), dtype=bool)
    has_node[agent[agent >= 0]] = True
    kept = np.arange(len(ids)) if unmatched == "isolate" else np.flatnonzero(has_node)
    number = np.full(len(ids), -1, dtype=np.int64)
    number[kept] = np.arange(len(kept))
    a, b = agent[graph.u], agent[graph.v]
    both = (a >= 0) & (b >= 0)
    without = tuple(ids[i] for i in np.flatnonzero(~has_node))
    lost = tuple(graph.nodes[i] for i in np.flatnonzero(agent < 0))
    report = _report(name, len(ids), len(graph.nodes), without, lost, unmatched)
    return Match(kept, number[a[both]], number[b[both]], report, without, lost)


def _unique_keys(ids, what: str, name: str) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for i, x in enumerate(ids):
        key = id_key(x)
        if key in out:
            raise ValueError(
                f"{name}: {what} ids {ids[out[key]]!r} and {x!r} are the same id (ids compare "
                "as integers when written as integers)"
            )
        out[key] = i
    return out


def _first(ids) -> str:
    shown = ", ".join(repr(x) for x in list(ids[:SHOWN]))
    return shown + (", …" if len(ids) > SHOWN else "")


def _report(
    name: str, n_agents: int, n_nodes: int, without: tuple, lost: tuple, unmatched: str
) -> str:
    """One line: how many agents have no node (and what was done), how many nodes no agent."""
    parts = []
    if without:
        done = "isolated" if unmatched == "isolate" else "dropped from the run"
        parts.append(
            f"{len(without)} of {n_agents} agents have no node ({done}: {_first(without)})"
        )
    if lost:
        parts.append(f"{len(lost)} of {n_nodes} nodes have no agent (dropped: {_first(lost)})")
    return f"{name}: " + "; ".join(parts) if parts else ""


# --------------------------------------------------------------------------------------------
# files read for a population numbered 0…M−1


def _read_edgelist(file: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    u: list[int] = []
    v: list[int] = []
    try:
        _edges(file, n, u, v)
    except UnicodeDecodeError:  # binary, UTF-16, Latin-1: never echo the bytes
        raise ValueError(f"{file}: {_NOT_TEXT}") from None
    if not u:
        raise ValueError(f"{file}: no edges (only comments or blank lines)")
    return np.array(u, dtype=np.int64), np.array(v, dtype=np.int64)


def _edges(file: Path, n: int, u: list[int], v: list[int]) -> None:
    """Append the edges of edge-list `file` to `u` and `v`, each line checked."""
    with file.open(encoding="utf-8") as fh:
        for lineno, line, text in _edge_fields(fh, file):
            try:
                a, b = int(text[0]), int(text[1])
            except (ValueError, IndexError):
                raise ValueError(
                    f"{file}:{lineno}: {line.strip()!r}: expected two agent numbers"
                ) from None
            for x in (a, b):
                if not 0 <= x < n:
                    raise ValueError(f"{file}:{lineno}: agent {x} outside 0…{n - 1} (M = {n})")
            if a == b:
                raise ValueError(f"{file}:{lineno}: self-loop {a}–{b}: G has none")
            u.append(a)
            v.append(b)


def _read_graphml(file: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        g = _nx().read_graphml(file)
    except Exception as exc:  # networkx raises several parser errors; report any of them
        raise ValueError(f"{file}: not readable GraphML: {exc}") from None
    if g.number_of_nodes() != n:
        raise ValueError(f"{file}: {g.number_of_nodes()} nodes, but the data have M = {n} agents")
    if _nx().number_of_selfloops(g):
        raise ValueError(f"{file}: has self-loops; G has none")
    index = {node: i for i, node in enumerate(g.nodes())}
    pairs = np.array([(index[a], index[b]) for a, b in g.edges()], dtype=np.int64)
    pairs = pairs.reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]
