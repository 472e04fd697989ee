"""Graph models a study file names in its [topology] table, registered in `TOPOLOGIES`.

Each model is a frozen dataclass of validated parameters with two methods: `check(n)` raises a
one-line ValueError for a request that cannot be met with n agents (called before any run), and
`make(n, rng)` draws the graph from the run's ``topology`` stream (a common-random-numbers stream:
every scenario of a study sees the same graph for the same data set-up and replicate). `build`
does both and warns when the graph is disconnected. Watts–Strogatz and Barabási–Albert graphs
come from networkx (seeded from the stream, so they are reproducible for a given networkx
version); random r-regular graphs are networkx's `random_regular_graph` (networkx 3.x) redone
here with the same random draws, vectorised (the same graph, several times faster, without
importing networkx); the others are drawn with numpy and scipy.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from desim import fast
from desim.kernel.params import param
from desim.kernel.registry import TOPOLOGIES
from desim.topologies.graph import Graph


class TopologyWarning(UserWarning):
    """A graph that can be simulated but probably not as intended (e.g. disconnected)."""


class Topology:
    """Base of the graph models: check the request, draw the graph, warn if disconnected."""

    def check(self, n: int) -> None:
        """Raise ValueError (one line) if this model cannot make a graph on n agents."""

    def make(self, n: int, rng: np.random.Generator) -> Graph:
        """Draw the graph on n agents from `rng`."""
        raise NotImplementedError

    def build(self, n: int, rng: np.random.Generator) -> Graph:
        """`check`, `make`, and a `TopologyWarning` when G is not connected."""
        self.check(n)
        return self.warn_if_disconnected(self.make(n, rng))

    def warn_if_disconnected(self, graph: Graph) -> Graph:
        """`graph`, after a `TopologyWarning` (at the caller of the method that built it) when
        it is not connected."""
        if graph.n_components > 1:
            sizes = np.bincount(graph.components)
            warnings.warn(
                f"{self}: the graph is disconnected ({graph.n_components} components, the "
                f"largest has {sizes.max()} of {graph.n} agents)",
                TopologyWarning,
                stacklevel=3,
            )
        return graph


def _nx_seed(rng: np.random.Generator) -> int:
    """An integer seed for networkx drawn from the topology stream."""
    return int(rng.integers(0, 2**32))


def _nx() -> Any:
    """networkx, imported when a generator needs it (a run with another graph does not)."""
    import networkx

    return networkx


def _from_nx(g: Any, n: int) -> Graph:
    edges = np.array(list(g.edges()), dtype=np.int64).reshape(-1, 2)
    return Graph.from_edges(n, edges[:, 0], edges[:, 1])


@TOPOLOGIES.register("complete")
@dataclass(frozen=True)
class Complete(Topology):
    """Every pair of agents is linked (the all-to-all setting of ColME)."""

    def make(self, n: int, rng: np.random.Generator) -> Graph:
        u, v = np.triu_indices(n, k=1)
        return Graph.from_edges(n, u, v)


@TOPOLOGIES.register("regular")
@dataclass(frozen=True)
class RandomRegular(Topology):
    """A uniformly random r-regular graph G(M, r) (Galante et al.; seed 001 §V)."""

    degree: int = param(10, "degree r of every agent", ge=1)

    def check(self, n: int) -> None:
        if self.degree >= n:
            raise ValueError(
                f"degree = {self.degree}: an r-regular graph on M = {n} agents needs r < M"
            )
        if self.degree * n % 2:
            raise ValueError(
                f"degree = {self.degree} with M = {n} agents: r·M = "
                f"{self.degree * n} is odd, so no r-regular graph exists"
            )

    def make(self, n: int, rng: np.random.Generator) -> Graph:
        keys = random_regular_keys(self.degree, n, _nx_seed(rng))
        return Graph.from_edges(n, keys // n, keys % n)


def random_regular_keys(d: int, n: int, seed: int) -> np.ndarray:
    """The links {u, v}, u < v, as keys u·n + v, of networkx's `random_regular_graph(d, n,
    seed)`: the pairing algorithm of Steger and Wormald ("Generating random regular graphs
    quickly"), with the same draws from `random.Random(seed)`.

    Each attempt pairs the shuffled list of stubs (every node d times) two by two; a pair that is
    a loop or an existing link goes back, with its nodes, to a list of leftover stubs — ordered
    by each node's first appearance among the rejected pairs, as networkx's dict — which is
    shuffled and paired again, until none is left (success) or no leftover pair could ever be
    linked (a new attempt, from the same random stream). The shuffles must consume the stream as
    `random.shuffle` does: `shuffled` computes its permutation from the same words with numpy.
    The pairing is vectorised: a pair is kept iff it is no loop, not yet a link and the first
    of its kind in this pass.
    """
    if d == 0:
        return np.empty(0, dtype=np.int64)
    draw = random.Random(seed)
    while True:
        keys = _regular_attempt(d, n, draw)
        if keys is not None:
            return keys


def _regular_attempt(d: int, n: int, draw: random.Random) -> np.ndarray | None:
    links = np.empty(0, dtype=np.int64)  # sorted keys
    stubs = np.tile(np.arange(n, dtype=np.int64), d)  # list(range(n)) * d
    while len(stubs):
        pairs = shuffled(stubs, draw).reshape(-1, 2)
        low, high = pairs.min(axis=1), pairs.max(axis=1)
        key = low * n + high
        ok = low != high
        if len(links):
            ok &= ~_member(key, links)
        first = np.zeros(len(key), dtype=bool)  # first occurrence of each key in this pass
        first[np.unique(np.where(ok, key, -1), return_index=True)[1]] = True
        ok &= first
        # the new keys are distinct and not yet links: their union is a sort (np.union1d
        # would hash them to drop repeats that cannot occur)
        links = np.sort(np.concatenate([links, key[ok]]))
        # leftover stubs: each node of a rejected pair, in order of first appearance
        order = np.stack([low[~ok], high[~ok]], axis=1).ravel()
        if len(order) == 0:
            return links
        nodes, where, counts = np.unique(order, return_index=True, return_counts=True)
        nodes, counts = nodes[np.argsort(where)], counts[np.argsort(where)]
        if not _suitable(links, nodes.tolist(), n):
            return None
        stubs = np.repeat(nodes, counts)
    return links


#: Words of `random.Random`'s stream drawn at a time, at most.
WORDS = 1 << 20
#: Lists shorter than this are shuffled by `random.shuffle` itself (numpy's set-up costs more).
SMALL = 1 << 12
#: Lists of at least this many items are shuffled by a compiled loop when the kernels are
#: available (`generator_kernels`): its random reads beat `_swapped`'s sorts from here on.
COMPILED_FROM = 1 << 16


def shuffled(x: np.ndarray, draw: random.Random) -> np.ndarray:
    """A copy of x in the order `draw.shuffle(list(x))` gives, leaving `draw` where that
    shuffle leaves it: the same permutation from the same 32-bit words of the Mersenne Twister,
    computed with numpy (Python's shuffle pays an interpreted call per item)."""
    if len(x) < SMALL or len(x) > 1 << 32:  # beyond 2³²: more than one word per draw
        out = x.tolist()
        draw.shuffle(out)
        return np.array(out, dtype=x.dtype)
    j = _shuffle_draws(len(x), draw)
    if len(x) >= COMPILED_FROM and fast.compiled():  # the swaps themselves, one by one
        from desim.topologies import generator_kernels

        return generator_kernels.shuffled(x, j)
    return x[_swapped(len(x), j)]


def _twister(draw: random.Random) -> np.random.MT19937:
    """numpy's Mersenne Twister in the state of `draw` (the two keep the same state)."""
    _, words, _ = draw.getstate()
    mt = np.random.MT19937()
    key = np.array(words[:-1], dtype=np.uint32)
    mt.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": words[-1]}}
    return mt


def _shuffle_draws(count: int, draw: random.Random) -> np.ndarray:
    """The j that `random.shuffle` draws for a list of `count` items, for i = count − 1, …, 1
    in turn: ``randbelow(i + 1)``, a word's top k bits (k the bit length of i + 1) redrawn while
    they are ≥ i + 1. `draw` is left after the last word used.

    Whether a word is taken depends on how many were taken before it, which a chunk of c words
    bounds: from n = i + 1 at its start, every word meets an n in (n − c, n], so a word below
    n − c + 1 is taken and one at least n is redrawn, whatever came before; the chunk's outcomes
    are exact up to its first word in between, which is decided with the exact n, and the next
    chunk starts after it. With c ≈ √n about c²/n words of a chunk fall in between.
    """
    mt = _twister(draw)
    out = np.empty(count - 1, dtype=np.int64)
    words = np.empty(0, dtype=np.int64)
    base = used = filled = 0  # stream index of words[0]; words used; draws made
    n = count
    while n >= 2:
        k = n.bit_length()
        # about √n words: one or two of them fall between, where the chunk is read again;
        # n keeps its bit length over the chunk
        c = min(math.isqrt(n) + 1, n - (1 << (k - 1)) + 1)
        if used + c > base + len(words):
            more = mt.random_raw(min(WORDS, 2 * n)).astype(np.int64)  # n draws: about 1.4 n
            words = np.concatenate([words[used - base :], more])
            base = used
        r = words[used - base : used - base + c] >> (32 - k)
        between = (r >= n - c + 1) & (r < n)
        a = int(between.argmax()) if between.any() else c
        taken = r[:a][r[:a] < n]
        out[filled : filled + len(taken)] = taken
        filled, n, used = filled + len(taken), n - len(taken), used + a
        if a < c:
            if r[a] < n:
                out[filled] = r[a]
                filled, n = filled + 1, n - 1
            used += 1
    mt = _twister(draw)
    for lo in range(0, used, WORDS):  # leave `draw` after the words used
        mt.random_raw(min(WORDS, used - lo), output=False)
    key, pos = mt.state["state"]["key"], mt.state["state"]["pos"]
    draw.setstate((3, (*key.tolist(), int(pos)), draw.getstate()[2]))
    return out


def _swapped(count: int, j: np.ndarray) -> np.ndarray:
    """The index of the item each place of a list of `count` holds after the swaps
    x[i] ↔ x[j_i] for i = count − 1, …, 1 in turn (`j` in that order).

    Place i is final after its swap: it takes what place j_i held then, which is the item i'
    put there by the last earlier swap onto j_i (the least i' > i with j_i' = j_i), or item j_i
    if none. What place i' held just before its own swap is, in the same way, what the last
    earlier swap onto i' put there (the least i'' > i' with j_i'' = i'), or item i': chains
    that pointer jumping follows to their ends. Place 0 holds what place 0 held at the end.
    """
    step = np.arange(count - 1, 0, -1, dtype=np.int64)
    key = np.sort(j * count + step)  # swaps by the place they hit, then by i
    hit, at = np.divmod(key, count)
    same = hit[1:] == hit[:-1]
    later = np.full(len(key), -1, dtype=np.int64)  # the next swap onto the same place
    later[:-1] = np.where(same, at[1:], -1)
    first = np.flatnonzero(np.concatenate(([True], ~same)))
    # the least i' > p with j_i' = p: the first swap onto p, or the next if that is p's own
    onto = np.where(at[first] == hit[first], later[first], at[first])
    end = np.arange(count, dtype=np.int64)
    has = onto >= 0
    end[hit[first][has]] = onto[has]
    going = hit[first][has]  # the places with a chain to follow
    while len(going):  # pointer jumping, each place to the end of its chain
        nxt = end[going]
        jumped = end[nxt]
        moved = jumped != nxt
        end[going] = jumped
        going = going[moved]
    out = np.empty(count, dtype=np.int64)
    # place i = at takes what the last earlier swap onto j_i = hit put there, or item j_i
    out[at] = np.where(later >= 0, end[np.maximum(later, 0)], hit)
    out[0] = end[0]
    return out


def _member(key: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """key ∈ sorted_keys, elementwise."""
    if len(sorted_keys) == 0:
        return np.zeros(len(key), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, key), len(sorted_keys) - 1)
    return sorted_keys[at] == key


def _suitable(links: np.ndarray, nodes: list[int], n: int) -> bool:
    """Whether the leftover nodes may still be linked: networkx's `_suitable`, literally (its
    swap rebinds s1 for the rest of the inner loop, which decides which pairs it looks at)."""
    for s1 in nodes:
        for s2 in nodes:
            if s1 == s2:
                break
            if s1 > s2:
                s1, s2 = s2, s1  # noqa: PLW2901  (as networkx does)
            if not _member(np.array([s1 * n + s2]), links)[0]:
                return True
    return False


def _pair_from_index(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pair (i, j), i < j, numbered k = j(j−1)/2 + i (column-wise upper triangle)."""
    j = np.floor((1.0 + np.sqrt(1.0 + 8.0 * k)) / 2.0).astype(np.int64)
    j -= j * (j - 1) // 2 > k  # floating-point guard, at most one step either way
    j += (j + 1) * j // 2 <= k
    return k - j * (j - 1) // 2, j


@TOPOLOGIES.register("erdos-renyi")
@dataclass(frozen=True)
class ErdosRenyi(Topology):
    """G(M, p): every pair of agents is linked independently with probability p."""

    p: float = param(0.1, "probability p of each link", ge=0, le=1)

    def make(self, n: int, rng: np.random.Generator) -> Graph:
        pairs = n * (n - 1) // 2
        m = int(rng.binomial(pairs, self.p))  # the number of links, then which ones
        k = np.sort(rng.choice(pairs, size=m, replace=False)).astype(np.int64)
        u, v = _pair_from_index(k)
        return Graph.from_edges(n, u, v)


@TOPOLOGIES.register("ring")
@dataclass(frozen=True)
class Ring(Topology):
    """Agents on a cycle, each linked to its k nearest agents on either side."""

    k: int = param(1, "neighbours on each side", ge=1)

    def check(self, n: int) -> None:
        if 2 * self.k >= n:
            raise ValueError(f"k = {self.k}: a ring of M = {n} agents needs 2k < M")

    def make(self, n: int, rng: np.random.Generator) -> Graph:
        a = np.arange(n)
        u = np.repeat(a, self.k)
        v = (u + np.tile(np.arange(1, self.k + 1), n)) % n
        return Graph.from_edges(n, u, v)


@TOPOLOGIES.register("grid")
@dataclass(frozen=True)
class Grid(Topology):
    """A 2-D lattice of rows × (M/rows) agents, each linked to its 4 nearest neighbours."""

    rows: int | None = param(
        None, "number of rows (must divide M; default: the divisor of M closest to √M)", ge=1
    )
    periodic: bool = param(False, "wrap around both ways (a torus)")

    def shape(self, n: int) -> tuple[int, int]:
        """(rows, columns) of the lattice for n agents."""
        rows = self.rows
        if rows is None:
            rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
        return rows, n // rows

    def check(self, n: int) -> None:
        if self.rows is not None and n % self.rows:
            raise ValueError(f"rows = {self.rows} does not divide M = {n} agents")

    def make(self, n: int, rng: np.random.Generator) -> Graph:
        rows, cols = self.shape(n)
        idx = np.arange(n).reshape(rows, cols)
        right_u, right_v = idx[:, :-1].ravel(), idx[:, 1:].ravel()
        down_u, down_v = idx[:-1, :].ravel(), idx[1:, :].ravel()
        parts_u, parts_v = [right_u, down_u], [right_v, down_v]
        if self.periodic:
            if cols > 2:
                parts_u.append(idx[:, -1])
                parts_v.append(idx[:, 0])
            if rows > 2:
                parts_u.append(idx[-1, :])
                parts_v.append(idx[0, :])
        return Graph.from_edges(n, np.concatenate(parts_u), np.concatenate(parts_v))


@TOPOLOGIES.register("watts-strogatz")
@dataclass(frozen=True)
class WattsStrogatz(Topology):
    """Small world: a ring where each agent links its k nearest, each link rewired w.p. p."""

    k: int = param(4, "neighbours in the ring lattice (even: k/2 on each side)", ge=2)
    p: float = param(0.1, "rewiring probability of each link", ge=0, le=1)

    def check(self, n: int) -> None:
        if self.k % 2:
            raise ValueError(f"k = {self.k}: must be even (k/2 neighbours on each side)")
        if self.k >= n:
            raise ValueError(f"k = {self.k}: a ring lattice of M = {n} agents needs k < M")

    def make(self, n: int, rng: np.random.Generator) -> Graph:
        return _from_nx(_nx().watts_strogatz_graph(n, self.k, self.p, seed=_nx_seed(rng)), n)


@TOPOLOGIES.register("barabasi-albert")
@dataclass(frozen=True)
class BarabasiAlbert(Topology):
    """Scale free: each new agent links to m earlier ones by preferential attachment."""

    m: int = param(3, "links made by each arriving agent", ge=1)

    def check(self, n: int) -> None:
        if self.m >= n:
            raise ValueError(f"m = {self.m}: preferential attachment on M = {n} agents needs m < M")

    def make(self, n: int, rng: np.random.Generator) -> Graph:
        return _from_nx(_nx().barabasi_albert_graph(n, self.m, seed=_nx_seed(rng)), n)


@TOPOLOGIES.register("geometric")
@dataclass(frozen=True)
class Geometric(Topology):
    """Wireless range: agents uniform in the unit square, linked when within `radius`."""

    radius: float = param(0.1, "communication range (distance in the unit square)", gt=0)
    torus: bool = param(False, "measure distance on the torus (no border effects)")

    def make(self, n: int, rng: np.random.Generator) -> Graph:
        pos = rng.random((n, 2))
        from scipy.spatial import cKDTree  # here: only geometric graphs need it

        tree = cKDTree(pos, boxsize=1.0 if self.torus else None)
        pairs = tree.query_pairs(self.radius, output_type="ndarray")
        return Graph.from_edges(n, pairs[:, 0], pairs[:, 1], positions=pos)
