"""Graphs that change during a run: periodic random rewiring, or a sequence of graph files.

A [topology] table names its model as always (the graph in force from slot 1) and may add one of

- ``rewire = {every = k, fraction = q}``: before slots k, 2k, 3k, … (up to t_max),
  round(q·|E|) links chosen uniformly are dropped and as many pairs that were not linked,
  chosen uniformly, are linked. |E| is kept (so Σ_a deg a and C-ColME's γ = δ/(4 Σ_a deg a) are),
  degrees are not: an r-regular graph becomes irregular. The draws come from the run's
  ``rewire`` stream, common to every protocol of the study as the graph is, and a run without
  rewiring draws nothing from it (``every = 0``: never);
- ``sequence = [{at = τ₁, file = "g1.edges"}, {at = τ₂, file = …}, …]``: from slot τ_i on
  (1 ≤ τ₁ < τ₂ < … ≤ t_max) the graph is the file's, an edge list as ``model = "file"`` reads it
  ("u v" per line, agents 0…M−1). Files are relative to the study folder; their sha256 is part
  of the run's configuration.

`GraphSchedule` is the run's schedule: the times the graph changes, and at each of them the new
graph with the links added and dropped (what `desim.kernel.protocol.FollowsGraph` protocols
are told). `graph_at(t)` gives the graph in force at slot t.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from desim import fast
from desim.kernel.fingerprint import sha256_file
from desim.kernel.params import ConfigError, build, param
from desim.kernel.randomness import Streams
from desim.topologies.files import FromFile
from desim.topologies.generators import _member, _pair_from_index
from desim.topologies.graph import Graph

#: The [topology] keys that make the graph change during a run.
DYNAMIC_KEYS = ("rewire", "sequence")
#: The random stream rewiring draws from (`desim.kernel.randomness.Streams.SHARED`).
REWIRE_STREAM = "rewire"
#: Graphs of more agents than this take the draw's compiled passes (`rewire_kernels`) when
#: `desim.fast.compiled()`; on smaller ones numba's load would cost more than they save.
COMPILED_ABOVE = 1000


@dataclass(frozen=True)
class Rewire:
    """Periodic random rewiring: every `every` slots a fraction `fraction` of the links moves."""

    every: int = param(0, "rewire before every k-th slot (0: never)", ge=0)
    fraction: float = param(0.1, "fraction q of the links replaced by random non-links", gt=0, le=1)


@dataclass(frozen=True)
class Switch:
    """One entry of a sequence: from slot `at` on, the graph of edge-list `file`."""

    at: int = param(1, "the slot from which the file's graph is in force", ge=1)
    file: str = param("", "edge-list file, relative to the study folder")
    sha256: str = param("", "sha256 of the file, set by desim when a study is expanded")


def split(table: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the model's own table, its dynamic keys `DYNAMIC_KEYS`) of a [topology] table."""
    static = {k: v for k, v in table.items() if k not in DYNAMIC_KEYS}
    return static, {k: table[k] for k in DYNAMIC_KEYS if k in table}


@dataclass(frozen=True)
class Dynamics:
    """How a run's graph changes: a `Rewire`, or a sequence of `Switch`es (one of them)."""

    rewire: Rewire | None = None
    sequence: tuple[Switch, ...] = ()

    @property
    def changes(self) -> bool:
        """Whether the graph changes at all during a run."""
        return bool(self.sequence) or (self.rewire is not None and self.rewire.every > 0)

    def schedule(
        self, graph: Graph, t_max: int, rng: Callable[[], np.random.Generator], folder: str = ""
    ) -> GraphSchedule:
        """The run's schedule from its first `graph` (`rng`: makes the rewire stream afresh,
        `rewire_stream`; asked only when a rewiring happens)."""
        return GraphSchedule(self, graph, t_max, rng, folder)

    def check(self, graph: Graph, t_max: int, folder: str = "") -> None:
        """Raise ValueError (one line) when this cannot run on `graph` (rewiring with too few
        non-links; a file that cannot be read, names an agent outside the graph, or changed)."""
        if self.rewire is not None and self.rewire.every > 0:
            moved = moved_links(graph, self.rewire.fraction)
            free = graph.n * (graph.n - 1) // 2 - graph.n_links
            if moved > free:
                raise ValueError(
                    f"rewire: fraction = {self.rewire.fraction:g} moves {moved} links, but "
                    f"only {free} pairs are not linked; use a smaller fraction"
                )
        for switch in self.sequence:
            read_switch(switch, graph.n, folder)


def dynamics(table: dict[str, Any], t_max: int) -> Dynamics:
    """The `Dynamics` of a [topology] table's dynamic keys, validated against the horizon.

    Raises `ConfigError` in one line: a fraction outside (0, 1], a switch time beyond t_max or
    not increasing, an empty sequence, rewire beside sequence.
    """
    _, dyn = split(table)
    if "rewire" in dyn and "sequence" in dyn:
        raise ConfigError("[topology]: rewire and sequence: give one of them, not both")
    if "rewire" in dyn:
        value = dyn["rewire"]
        if not isinstance(value, dict):
            raise ConfigError(
                f"[topology]: rewire = {value!r}: must be a table {{every = k, fraction = q}}"
            )
        return Dynamics(rewire=build(Rewire, value, "[topology]: rewire"))
    if "sequence" not in dyn:
        return Dynamics()
    seq = dyn["sequence"]
    if not isinstance(seq, list) or not seq or not all(isinstance(s, dict) for s in seq):
        raise ConfigError(
            f"[topology]: sequence = {seq!r}: must be a non-empty list of tables "
            '{at = slot, file = "graph.edges"}'
        )
    out = []
    for i, entry in enumerate(seq):
        where = f"[topology]: sequence[{i}]"
        if "file" not in entry or "at" not in entry:
            raise ConfigError(f"{where}: needs at (a slot) and file (an edge list)")
        switch = build(Switch, entry, where)
        if switch.at > t_max:
            raise ConfigError(f"{where}: at = {switch.at}: beyond t_max = {t_max}")
        if out and switch.at <= out[-1].at:
            raise ConfigError(
                f"{where}: at = {switch.at}: times must increase (the entry before is at = "
                f"{out[-1].at})"
            )
        out.append(switch)
    return Dynamics(sequence=tuple(out))


def read_switch(switch: Switch, n: int, folder: str = "") -> Graph:
    """The graph of a sequence entry on n agents (ValueError: unreadable, an unknown agent,
    or a file that changed since the study was expanded)."""
    path = Path(folder) / switch.file if folder else Path(switch.file)
    if switch.sha256 and path.is_file() and sha256_file(path) != switch.sha256:
        raise ValueError(f"{switch.file}: changed since the study was expanded; run again")
    try:
        return FromFile(path=str(path), format="edgelist").make(n, np.random.default_rng(0))
    except ValueError as exc:
        text = str(exc).replace(str(path), switch.file)
        raise ValueError(f"[topology]: sequence: {text}") from None


def moved_links(graph: Graph, fraction: float) -> int:
    """round(q·|E|): the links one rewiring moves."""
    return int(round(fraction * graph.n_links))


def link_keys(graph: Graph) -> np.ndarray:
    """Every link {u, v}, u < v, as the sorted keys u·n + v."""
    u, v = graph.links()
    return u * graph.n + v  # CSR order of u then v: sorted


def rewired(graph: Graph, fraction: float, rng: np.random.Generator) -> Graph:
    """`graph` with round(q·|E|) uniform links replaced by as many uniform non-links."""
    return _rewiring(graph, fraction, rng)[0]


def _rewiring(
    graph: Graph, fraction: float, rng: np.random.Generator, keys: np.ndarray | None = None
) -> tuple[Graph, np.ndarray, np.ndarray, np.ndarray]:
    """(`rewired` graph, the keys u·n + v of its new links, of its dropped links, of all its
    links: `link_keys` of the new graph); `keys`: `link_keys(graph)` where the caller holds
    them (a schedule keeps each change's for the next)."""
    n = graph.n
    keys = link_keys(graph) if keys is None else keys
    m = moved_links(graph, fraction)
    dropped = np.sort(rng.choice(len(keys), size=m, replace=False))
    pairs = n * (n - 1) // 2
    passes = _passes(n)
    fresh = np.empty(0, dtype=np.int64)
    while len(fresh) < m:  # uniform non-links: draw pairs, keep new ones, in draw order
        k = rng.integers(0, pairs, size=2 * (m - len(fresh)) + 8)
        i, j = _pair_from_index(k)
        new = passes.first_new(i * n + j, graph, keys, fresh, m - len(fresh))
        fresh = np.concatenate([fresh, new])[:m]
    lost, added = keys[dropped], np.sort(fresh)
    return passes.relinked(graph, added, lost), added, lost, passes.merged(keys, dropped, added)


def _directed(links: np.ndarray, n: int) -> np.ndarray:
    """Both directions a·n + b of the link keys u·n + v, sorted."""
    return np.sort(np.concatenate([links, links % n * n + links // n]))


def _first_new(cand: np.ndarray, keys: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """The keys `cand` that are neither in sorted `keys` nor in `fresh`, each at its first
    occurrence, in draw order. (Whether a key is kept depends on its value only, so the first
    occurrences of the kept values are those of every value; one stable sort finds them and
    sorts the searches' keys, which makes the search of `keys` cheaper.)"""
    order = np.argsort(cand, kind="stable")
    ranked = cand[order]
    first = np.ones(len(ranked), dtype=bool)
    first[1:] = ranked[1:] != ranked[:-1]  # (stable: the first in sorted order is the earliest)
    ranked, order = ranked[first], order[first]
    new = ~_member(ranked, keys) & ~np.isin(ranked, fresh)
    return cand[np.sort(order[new])]


def _merged(kept: np.ndarray, added: np.ndarray) -> np.ndarray:
    """Two sorted arrays with no common entry as one sorted array (a merge, not a sort)."""
    return np.insert(kept, np.searchsorted(kept, added), added)


def _relinked(graph: Graph, added: np.ndarray, lost: np.ndarray) -> Graph:
    """`graph` with the links of keys `added` made and of keys `lost` dropped (both sorted):
    `Graph.from_edges` of the new link set, its CSR arrays edited in place of a sort of every
    link (the rows' neighbours stay increasing, so the arrays are the same)."""
    n = graph.n
    directed = graph.src * n + graph.indices  # CSR order: sorted
    # (the searches' keys sorted too: each search starts near the last one's end)
    gone, made = _directed(lost, n), _directed(added, n)
    drop = np.searchsorted(directed, gone)
    keep = np.ones(len(directed), dtype=bool)
    keep[drop] = False
    at = np.searchsorted(directed, made)
    at -= np.searchsorted(drop, at)  # places among the kept edges
    indices = np.insert(graph.indices[keep], at, made % n)
    degree = graph.degree + np.bincount(made // n, minlength=n)
    degree -= np.bincount(gone // n, minlength=n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree, out=indptr[1:])
    return Graph(n, indptr, indices)


class _NumpyPasses:
    """The draw's passes over every link, as numpy passes."""

    relinked = staticmethod(_relinked)

    @staticmethod
    def first_new(cand: np.ndarray, graph: Graph, keys: np.ndarray, fresh: np.ndarray, most: int):
        """`_first_new`'s first `most` (the links of `graph` are the sorted `keys`)."""
        return _first_new(cand, keys, fresh)[:most]

    @staticmethod
    def merged(keys: np.ndarray, dropped: np.ndarray, added: np.ndarray) -> np.ndarray:
        """`link_keys` of the new graph: `keys` without the places `dropped`, with `added`."""
        return _merged(np.delete(keys, dropped), added)


class _CompiledPasses:
    """The same passes as compiled loops (`desim.topologies.rewire_kernels`): the same arrays."""

    def __init__(self) -> None:
        from desim.topologies import rewire_kernels

        self.merged = rewire_kernels.merged_without
        self._first_new = rewire_kernels.first_new

    def first_new(
        self, cand: np.ndarray, graph: Graph, keys: np.ndarray, fresh: np.ndarray, most: int
    ):
        """`_first_new`'s first `most`, a link looked for in its row of `graph` (whose links are
        `keys`), and no candidate looked at after them."""
        return self._first_new(cand, graph.indptr, graph.indices, fresh, most)

    @staticmethod
    def relinked(graph: Graph, added: np.ndarray, lost: np.ndarray) -> Graph:
        """`_relinked`'s graph from one pass over its CSR arrays."""
        from desim.topologies.rewire_kernels import relinked_csr

        n = graph.n
        gone, made = _directed(lost, n), _directed(added, n)
        return Graph(n, *relinked_csr(graph.indptr, graph.indices, gone, made))


def _passes(n: int) -> _NumpyPasses | _CompiledPasses:
    """The draw's passes for a graph on n agents: compiled above `COMPILED_ABOVE` agents when
    `desim.fast.compiled()`, numpy's otherwise."""
    return _CompiledPasses() if n > COMPILED_ABOVE and fast.compiled() else _NumpyPasses()


def _pairs(keys: np.ndarray, n: int) -> np.ndarray:
    """Link keys u·n + v as a (k, 2) array of pairs (u, v)."""
    return np.stack([keys // n, keys % n], axis=1)


def difference(old: Graph, new: Graph) -> tuple[np.ndarray, np.ndarray]:
    """(added, dropped): the links of `new` not in `old` and of `old` not in `new`, each an
    (k, 2) array of pairs (u, v), u < v, in key order."""
    a, b = link_keys(old), link_keys(new)
    return _pairs(b[~_member(b, a)], old.n), _pairs(a[~_member(a, b)], old.n)


def rewire_stream(streams: Streams) -> np.random.Generator:
    """A fresh generator of the run's ``rewire`` stream (the same draws at every call)."""
    seq = np.random.SeedSequence(streams.root, spawn_key=streams.spawn_key(REWIRE_STREAM))
    return np.random.Generator(np.random.PCG64(seq))


class GraphSchedule:
    """A run's changing graph: the slots it changes at, and each change as it comes."""

    def __init__(
        self,
        dyn: Dynamics,
        graph: Graph,
        t_max: int,
        rng: Callable[[], np.random.Generator],
        folder: str = "",
    ) -> None:
        self._dyn, self._make_rng, self._folder = dyn, rng, folder
        self._rng: np.random.Generator | None = None  # made at the first rewiring
        self._keys: np.ndarray | None = None  # `link_keys` of the graph in force, once rewired
        self._t_max = t_max
        self.graph = graph  # the graph in force
        self._first = graph
        if dyn.sequence:
            times = [s.at for s in dyn.sequence]
        elif dyn.rewire is not None and dyn.rewire.every > 0:
            times = list(range(dyn.rewire.every, t_max + 1, dyn.rewire.every))
        else:
            times = []
        #: The slots before which the graph changes, increasing.
        self.times = np.asarray(times, dtype=np.int64)
        self._next = 0

    def change(self, t: int) -> tuple[Graph, np.ndarray, np.ndarray]:
        """The change due before slot t (the next in `times`): (new graph, added, dropped)."""
        if self._next >= len(self.times) or self.times[self._next] != t:
            raise ValueError(f"no graph change is due at slot {t}")
        i = self._next
        self._next += 1
        if self._dyn.sequence:
            new = read_switch(self._dyn.sequence[i], self.graph.n, self._folder)
        else:
            rewire = self._dyn.rewire
            assert rewire is not None
            if self._rng is None:
                self._rng = self._make_rng()
            new, added, dropped, self._keys = _rewiring(
                self.graph, rewire.fraction, self._rng, self._keys
            )
            self.graph = new
            return new, _pairs(added, new.n), _pairs(dropped, new.n)
        added, dropped = difference(self.graph, new)
        self.graph = new
        return new, added, dropped

    def graph_at(self, t: int) -> Graph:
        """The graph in force at slot t (replayed from the first graph on a fresh schedule:
        rewiring draws depend on every earlier one)."""
        replay = GraphSchedule(self._dyn, self._first, self._t_max, self._make_rng, self._folder)
        for when in replay.times:
            if when > t:
                break
            replay.change(int(when))
        return replay.graph
