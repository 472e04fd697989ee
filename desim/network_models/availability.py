"""Availability of links and nodes over time: outages, Gilbert–Elliott links, churn, traces.

An `Availability` model (registered in `AVAILABILITY`, built from a study-file table by
`availability`) is bound to one run with `bind(n_addresses, scope, rng)`; the bound object
answers `up(t, entity)` for arrays of entities and `stationary(entity)`, the long-run P(up).
Addresses are 0 … n_addresses − 1 (agents, then the server). Scope ``"link"``: an entity is an
unordered pair, `link_entity` (both directions of a link share its state); scope ``"node"``: an
entity is an address.

Realisations are counter-based: the state of an entity is a fixed function of (key, entity,
time), where the key is drawn once from the run's stream at bind. So the answer for an entity
does not depend on which or how many other entities were asked, nor in which order (common
random numbers across protocols that send differently).

Models and their semantics:

* ``always``: always up.
* ``bernoulli``: up with probability p, i.i.d. per entity and slot ⌊t⌋.
* ``markov`` (Gilbert–Elliott): a two-state chain in whole slots; up and down sojourns are
  geometric with means `mean_up` and `mean_down`; the state at slot 0 is drawn from the
  stationary law, so (sojourns being memoryless) the chain is stationary at every slot. The state
  at time t is that of slot ⌊t⌋.
* ``churn``: an alternating renewal process in continuous time with `session` (up) and
  `offline` (down) sojourn distributions. The state at time 0 is drawn from the long-run law
  P(up) = E[session]/(E[session] + E[offline]); the first sojourn is a fresh draw, not the
  residual life (exact only for exponential sojourns; otherwise the start is a transient that
  fades after a few cycles).
* ``trace``: intervals [start, end) of a CSV file replayed exactly; outside them the `default`
  state.

Markov and churn are realised lazily: per entity the index k of its current sojourn, the
sojourn's state, start and end; sojourn k of an entity has length
``ppf(counter_uniform(key, (k + 1)·n_entities + entity))``. Up to `RenewalBound.DENSE` entities
these are dense arrays indexed by entity; beyond (n_addresses² is 10⁸ links for 10⁴ addresses)
they hold only the entities asked so far, in order of first sight, found through a hash index
(`RowIndex`: adding entities costs nothing for those already held). Advancing to t loops
over blocks of sojourn steps, each vectorised over the entities still behind t, so an entity
asked rarely catches up in one or two numpy passes. With few entities (up to
`BufferedRenewal.BUFFERED`, e.g. every link of 255 agents) the ends of each entity's next
AHEAD sojourns are kept instead, so a question is one look-up per entity in its row, and rows
are renewed in blocks as they run out. Times should be non-decreasing (simulation time); an
earlier time is answered correctly by replaying the entity from time 0. Every realisation
gives the same floats: sojourn ends are summed in sequence from time 0 whatever the blocks.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from desim.kernel.links import counter_uniform
from desim.kernel.params import ConfigError, build, param
from desim.kernel.registry import AVAILABILITY
from desim.kernel.rowindex import RowIndex
from desim.network_models.distributions import Distribution, Geometric, distribution

Scope = Literal["link", "node"]


def link_entity(src: Any, dst: Any, n_addresses: int) -> np.ndarray:
    """The entity id of the unordered link {src, dst}: min·n_addresses + max."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    return np.minimum(src, dst) * n_addresses + np.maximum(src, dst)


def n_entities(n_addresses: int, scope: Scope) -> int:
    """The size of the entity space: n_addresses² links (ordered ids of unordered pairs) or
    n_addresses nodes."""
    if scope == "link":
        return n_addresses * n_addresses
    if scope == "node":
        return n_addresses
    raise ValueError(f"scope = {scope!r}: must be 'link' or 'node'")


def _key(rng: np.random.Generator) -> np.uint64:
    return np.uint64(rng.integers(0, 2**63))


def _entities(entity: Any) -> np.ndarray:
    return np.asarray(entity, dtype=np.int64)


def _distinct(ids: np.ndarray) -> np.ndarray:
    """The distinct `ids`, ascending (a sort, not `np.unique`: several times less on thousands)."""
    ids = np.sort(ids)
    return ids[np.concatenate(([True], ids[1:] != ids[:-1]))]


def _time_by_time(
    ask: Callable[[float, np.ndarray], np.ndarray],
    t: np.ndarray,
    entity: np.ndarray,
    dtype: type,
) -> np.ndarray:
    """ask(t_i, entity_i) for one time per entity, asked once per distinct time in increasing
    order: a model that moves to one time at a time still takes a window's messages in one
    question (`per_message`), at the cost of one step per distinct time."""
    t = np.asarray(t, dtype=float).ravel()
    flat = entity.ravel()
    out = np.empty(len(flat), dtype=dtype)
    if not len(flat):
        return out.reshape(entity.shape)
    if (t[1:] >= t[:-1]).all():  # the usual case (a window's messages): runs, no sort
        cuts = [0, *((t[1:] != t[:-1]).nonzero()[0] + 1).tolist(), len(t)]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            out[a:b] = ask(float(t[a]), flat[a:b])
        return out.reshape(entity.shape)
    order = np.argsort(t, kind="stable")
    cuts = np.flatnonzero(t[order][1:] != t[order][:-1]) + 1
    for part in np.split(order, cuts):
        out[part] = ask(float(t[part[0]]), flat[part])
    return out.reshape(entity.shape)


class BoundAvailability:
    """The availability of every entity of one run: always up unless a model says otherwise."""

    #: True when `up` depends on the time only through its slot ⌊t⌋.
    per_slot: bool = True
    #: True when `up` also takes one time per entity (an array t shaped like `entity`).
    per_message: bool = True

    def up(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        """Whether each entity is up at time t (a bool array shaped like `entity`)."""
        return np.ones(np.shape(entity), dtype=bool)

    def stationary(self, entity: np.ndarray) -> np.ndarray:
        """The long-run probability that each entity is up."""
        return np.ones(np.shape(entity))


class Availability:
    """A model of when links or nodes are up; `bind` realises it for one run."""

    def bind(
        self,
        n_addresses: int,
        scope: Scope,
        rng: np.random.Generator,
        base_dir: Path | str | None = None,
    ) -> BoundAvailability:
        """The availability of the `scope` entities of a run with `n_addresses` addresses.

        `rng` is the model's own stream (drawn from once); `base_dir` resolves relative file
        names (the current directory when None).
        """
        raise NotImplementedError


@AVAILABILITY.register("always")
@dataclass(frozen=True)
class Always(Availability):
    """Every entity is always up."""

    def bind(
        self,
        n_addresses: int,
        scope: Scope,
        rng: np.random.Generator,
        base_dir: Path | str | None = None,
    ) -> BoundAvailability:
        n_entities(n_addresses, scope)
        return BoundAvailability()


# ---------------------------------------------------------------------------------------------
# Bernoulli: i.i.d. per slot


class BernoulliBound(BoundAvailability):
    """Up with probability p, independently per entity and slot ⌊t⌋."""

    per_slot = True

    def __init__(self, p: float, n_entities: int, key: np.uint64) -> None:
        self.p = p
        self._n = np.uint64(n_entities)
        self._key = key

    def up(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        entity = _entities(entity)
        slot = np.floor(t).astype(np.uint64) if np.ndim(t) else np.uint64(math.floor(t))
        counter = slot * self._n + entity.astype(np.uint64)
        return counter_uniform(self._key, counter) < self.p

    def stationary(self, entity: np.ndarray) -> np.ndarray:
        return np.full(np.shape(entity), self.p)


@AVAILABILITY.register("bernoulli")
@dataclass(frozen=True)
class BernoulliAvailability(Availability):
    """Up with probability p in each slot, independently across slots and entities."""

    p: float = param(0.9, "probability of being up in a slot", ge=0, le=1)

    def bind(
        self,
        n_addresses: int,
        scope: Scope,
        rng: np.random.Generator,
        base_dir: Path | str | None = None,
    ) -> BernoulliBound:
        return BernoulliBound(self.p, n_entities(n_addresses, scope), _key(rng))


# ---------------------------------------------------------------------------------------------
# Alternating renewal processes (Markov in slots, churn in continuous time), realised lazily


class RenewalBound(BoundAvailability):
    """An alternating renewal process per entity: up sojourns ~ `up_law`, down ~ `down_law`.

    The state at time 0 is up with probability E[up]/(E[up] + E[down]); sojourn k ≥ 0 starts at
    the end of sojourn k − 1 (sojourn 0 at time 0). With `slotted`, time t is read as ⌊t⌋.
    """

    #: Up to this many entities the per-entity arrays are dense (indexed by entity; zeroed
    #: memory is only committed where touched: 26 bytes an entity, 218 MB at most, less than
    #: the hash index once most links are asked); beyond, they hold the entities seen so far.
    DENSE = 1 << 23

    def __init__(
        self,
        up_law: Distribution,
        down_law: Distribution,
        n_entities: int,
        key: np.uint64,
        slotted: bool,
    ) -> None:
        self.up_law = up_law
        self.down_law = down_law
        self.p_up = up_law.mean / (up_law.mean + down_law.mean)
        self.slotted = slotted
        self.per_slot = slotted
        self._n = np.uint64(n_entities)
        self._key = key
        # per entity (dense) or per entity seen so far (sparse: rows found by `_index`, the
        # entity of each row in `_ids`): the index k, state, start and end of its current sojourn
        size = n_entities if n_entities <= self.DENSE else 0
        self._index = None if size else RowIndex()
        self._ids: np.ndarray | None = None if size else np.empty(0, dtype=np.int64)
        self._seen = np.zeros(size, dtype=bool)
        self._k = np.zeros(size, dtype=np.int64)
        self._state = np.zeros(size, dtype=bool)
        self._start = np.zeros(size)
        self._end = np.zeros(size)
        self._latest = -math.inf  # the latest time asked: no sojourn starts after it

    def _entity(self, rows: np.ndarray) -> np.ndarray:
        return rows if self._ids is None else self._ids[rows]

    def _uniform(self, ids: np.ndarray, k: np.ndarray) -> np.ndarray:
        # counter (k + 1)·n_entities + entity is the entity's sojourn k; counter `entity` its
        # initial state
        counter = k.astype(np.uint64)
        counter += np.uint64(1)
        counter *= self._n
        counter += ids.astype(np.uint64)  # (ids may be one per column of k: broadcast)
        return counter_uniform(self._key, counter)

    def _length(self, ids: np.ndarray, k: np.ndarray, state: np.ndarray) -> np.ndarray:
        u = self._uniform(ids, k)
        if isinstance(self.up_law, Geometric) and isinstance(self.down_law, Geometric):
            return Geometric.ppf_of(u, np.where(state, self.up_law.log_q, self.down_law.log_q))
        out = np.empty(u.shape)
        out[state] = self.up_law.ppf(u[state])
        out[~state] = self.down_law.ppf(u[~state])
        return out

    def _first(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The state and end of sojourn 0 of each entity."""
        state = counter_uniform(self._key, ids.astype(np.uint64)) < self.p_up
        return state, self._length(ids, np.zeros(len(ids), dtype=np.int64), state)

    def _rows(self, entity: np.ndarray) -> np.ndarray:
        """The rows of `entity` in the per-entity arrays, starting the entities not seen yet."""
        if self._ids is None:
            fresh = ~self._seen[entity]
            if fresh.any():
                new = _distinct(entity[fresh])
                self._seen[new] = True
                self._state[new], self._end[new] = self._first(new)
            return entity
        rows = self._index.find(entity)
        new = rows < 0
        if not new.any():
            return rows
        fresh = _distinct(entity[new])
        at = self._index.add(fresh)
        if len(self._index) > len(self._ids):  # room for the new rows: double the arrays
            size = max(len(self._index), 2 * len(self._ids))
            for name in ("_ids", "_k", "_state", "_start", "_end"):
                held = getattr(self, name)
                grown = np.zeros(size, dtype=held.dtype)
                grown[: len(held)] = held
                setattr(self, name, grown)
        self._ids[at], self._k[at], self._start[at] = fresh, 0, 0.0
        self._state[at], self._end[at] = self._first(fresh)
        rows[new] = at[np.searchsorted(fresh, entity[new])]
        return rows

    def _advance(self, time: float, rows: np.ndarray) -> None:
        """Move every entity of `rows` to the sojourn that contains `time`."""
        if time < self._latest:  # a sojourn may start after `time`: check
            back = rows[self._start[rows] > time]
            if back.size:  # asked about the past: replay from time 0
                back = _distinct(back)
                state, end = self._first(self._entity(back))
                self._k[back], self._state[back] = 0, state
                self._start[back], self._end[back] = 0.0, end
        else:
            self._latest = time
        # (an entity asked twice is stepped twice, to the same state: cheaper than `np.unique`)
        behind = rows[self._end[rows] <= time]
        while behind.size:  # a block of sojourn steps for every entity still behind
            steps = self._block(time - self._end[behind].min(), len(behind))
            k, state, ends = self._steps(
                self._entity(behind), self._k[behind], self._state[behind], self._end[behind], steps
            )
            # the sojourn containing `time` is the first whose end is after it (ends ascend)
            last = np.minimum((ends[1:] <= time).sum(axis=0), steps - 1)
            at = np.arange(len(behind))
            self._k[behind], self._state[behind] = k[last, at], state[last, at]
            self._start[behind], self._end[behind] = ends[last, at], ends[last + 1, at]
            behind = behind[ends[last + 1, at] <= time]

    def _steps(
        self, ids: np.ndarray, k: np.ndarray, state: np.ndarray, end: np.ndarray, steps: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The next `steps` sojourns of entities `ids` whose sojourn k_i, in state state_i, ends
        at end_i: [j − 1, i] the index k_i + j and state of each, and [j, i] its end (j = 0 …
        steps; row 0 is end_i). Ends are summed in sequence from end_i, so they are the same
        floats whatever blocks an entity is stepped in; down the columns, one vector add per
        step rather than one short sum per entity."""
        j = np.arange(1, steps + 1)[:, None]
        kk = k + j
        state = state ^ (j % 2 == 1)  # states alternate
        ends = np.empty((steps + 1, len(ids)))
        ends[0] = end
        ends[1:] = self._length(ids, kk, state)  # (ids broadcast along the steps)
        np.add.accumulate(ends, axis=0, out=ends)
        return kk, state, ends

    def _block(self, gap: float, n_behind: int) -> int:
        """How many sojourn steps to draw at once: enough to cover `gap` on average (two per
        mean cycle, plus a margin), at most 2²² draws in all."""
        cycle = self.up_law.mean + self.down_law.mean
        want = math.ceil(2.5 * gap / cycle) + 2
        return max(1, min(want, 4096, (1 << 22) // n_behind))

    def _time(self, t: float) -> float:
        return float(math.floor(t)) if self.slotted else float(t)

    def _times(self, t: float | np.ndarray) -> float | np.ndarray:
        """The time(s) the chain is read at: t, or its slot ⌊t⌋ (one time or one per entity)."""
        if isinstance(t, float | int) or not np.ndim(t):
            return self._time(t)
        t = np.asarray(t, dtype=float).ravel()
        return np.floor(t) if self.slotted else t

    def up(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        entity = _entities(entity)
        if np.ndim(t):  # (stepping moves the entities asked to one time: time by time)
            return _time_by_time(self.up, self._times(t), entity, bool)
        rows = self._rows(entity.ravel())
        self._advance(self._time(t), rows)
        return self._state[rows].reshape(entity.shape)

    def next_switch(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        """The end of each entity's sojourn containing t: when its state next changes (a whole
        slot for Markov; a zero-length sojourn in between may leave it unchanged)."""
        entity = _entities(entity)
        if np.ndim(t):
            return _time_by_time(self.next_switch, self._times(t), entity, float)
        rows = self._rows(entity.ravel())
        self._advance(self._time(t), rows)
        return self._end[rows].reshape(entity.shape)

    def stationary(self, entity: np.ndarray) -> np.ndarray:
        return np.full(np.shape(entity), self.p_up)


class BufferedRenewal(RenewalBound):
    """`RenewalBound` for small entity spaces: the ends of each entity's next AHEAD sojourns are
    kept, so a question is a look-up in that row, not a step of the chain, and each entity may
    be asked at its own time (`per_message`: a window's messages in one question).

    Row e of `_ends` holds the ends of sojourns `_base[e]` … `_base[e]` + AHEAD − 1 of entity e
    (−∞ and base −1: not started), `_before[e]` the start of sojourn `_base[e]`; the state of
    sojourn k is that of sojourn 0 (`_state0`) flipped k times. Ends are summed in sequence
    from time 0 whatever blocks they are drawn in, so every answer equals `RenewalBound`'s.
    """

    #: Sojourns kept per entity, and the most entities that get this storage (AHEAD·BUFFERED
    #: floats: 16 MiB).
    AHEAD = 32
    BUFFERED = 1 << 16
    #: A renewal also extends the rows asked with it that are past this many kept ends. Rows
    #: running out cause renewals; extending from an eighth rather than half on makes that rarer
    #: (about 40 % fewer renewals when 200 agents ask each other under Markov outages).
    EXTEND_PAST = AHEAD // 8
    #: Questions about more rows than this extend none: some row runs out in nearly every such
    #: question anyway, and rewriting every worn row costs more than the renewals it saves
    #: (Private-ColME handed 32 slots at once asks 6400 rows: 25 % faster without).
    EXTEND_UP_TO = 1024

    def __init__(
        self,
        up_law: Distribution,
        down_law: Distribution,
        n_entities: int,
        key: np.uint64,
        slotted: bool,
    ) -> None:
        super().__init__(up_law, down_law, 0, key, slotted)
        self._n = np.uint64(n_entities)
        self._ids = None
        self._ends = np.full((n_entities, self.AHEAD), -np.inf)
        self._base = np.full(n_entities, -1, dtype=np.int64)
        self._before = np.zeros(n_entities)
        self._state0 = np.zeros(n_entities, dtype=bool)
        #: (time, rows, answer) of the last question `up` was asked at one time, or None.
        self._asked: tuple[float, np.ndarray, np.ndarray] | None = None
        self._marked = np.zeros(n_entities, dtype=bool)  # all False between calls (`_renew`)

    def _locate(
        self, time: float | np.ndarray, rows: np.ndarray, ends_too: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The index k and (if `ends_too`) the end of each entity's sojourn that contains `time`
        (one time, or one per row; an entity may be asked at several times)."""
        if not rows.size:
            return np.empty(0, dtype=np.int64), np.empty(0)
        one = isinstance(time, float)  # (not `np.ndim`: a Python-level wrapper, ~1 µs a call)
        first, last = (time, time) if one else (float(time.min()), float(time.max()))
        if first < self._latest:  # asked about the past: replay those before their rows
            back = rows[self._before[rows] > time]
            self._base[back] = -1
            self._ends[back] = -np.inf
        self._latest = max(self._latest, last)
        ends, at, held = self._position(time, rows)
        if held:  # the usual case: every row holds its time
            return self._base[rows] + at, ends[np.arange(len(rows)), at] if ends_too else None
        k, end = np.empty(len(rows), dtype=np.int64), np.empty(len(rows))
        todo = np.arange(len(rows))
        while True:
            done = at < self.AHEAD
            i = todo[done]
            k[i], end[i] = self._base[rows[i]] + at[done], ends[np.flatnonzero(done), at[done]]
            todo = todo[~done]
            if not todo.size:
                return k, end
            # renew the rows that ran out (or never started) at their earliest time asked, and
            # extend every row past EXTEND_PAST; an entity asked far apart takes more rounds
            worn = i[at[done] >= self.EXTEND_PAST] if len(rows) <= self.EXTEND_UP_TO else i[:0]
            self._renew(self._earliest(rows[todo], _at(time, todo)), rows[worn], _at(time, worn))
            ends, at, _ = self._position(_at(time, todo), rows[todo])

    @staticmethod
    def _earliest(rows: np.ndarray, time: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distinct `rows` and the earliest time each is asked at."""
        if isinstance(time, float):  # (a sort, not `np.unique`: several times less on hundreds)
            rows, time = np.sort(rows), np.full(len(rows), time)
        else:
            order = np.lexsort((time, rows))
            rows, time = rows[order], time[order]
        first = np.concatenate(([True], rows[1:] != rows[:-1]))
        return rows[first], time[first]

    def _position(
        self, time: float | np.ndarray, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """The kept ends of `rows`, the column of each one's first end after its `time`
        (AHEAD: none), and whether every row has one."""
        ends = self._ends.take(rows, axis=0)
        later = ends > (time if isinstance(time, float) else time[:, None])
        at = later.argmax(axis=1)  # ends ascend: the first True, or 0 when there is none
        held = later[:, -1]
        if held.all():
            return ends, at, True
        at[~held] = self.AHEAD
        return ends, at, False

    def _renew(
        self, out: tuple[np.ndarray, np.ndarray], worn: np.ndarray, worn_time: float | np.ndarray
    ) -> None:
        """Renew the distinct rows `out[0]` (run out, or not started) at times `out[1]`, then
        extend the rows `worn` (past EXTEND_PAST kept ends at `worn_time`) not among them."""
        out, time = out
        base = self._base[out]
        fresh = base < 0
        if fresh.any():
            new = out[fresh]
            self._state0[new] = counter_uniform(self._key, new.astype(np.uint64)) < self.p_up
        # from sojourn −1 "ending" at 0 (not started), else from the last kept one
        k = np.where(fresh, -1, base + self.AHEAD - 1)
        self._catch_up(time, out, k, np.where(fresh, 0.0, self._ends[out, -1]))
        self._marked[out] = True  # (`np.isin` sorts both: several times slower)
        keep = ~self._marked[worn]
        self._marked[out] = False
        if keep.any():
            rows, time = self._earliest(worn[keep], _at(worn_time, np.flatnonzero(keep)))
            self._extend(time, rows, self._position(time, rows)[1])

    def _catch_up(self, time: np.ndarray, rows: np.ndarray, k: np.ndarray, end: np.ndarray) -> None:
        """Keep AHEAD sojourn ends from the one holding time_i on, for unique `rows` whose sojourn
        k_i (−1: none before sojourn 0) ends at end_i ≤ time_i."""
        while rows.size:
            steps = self._block(float(np.max(time - end)), len(rows)) + self.AHEAD
            ends = self._draw(rows, k, end, steps)  # [j, i]: end of sojourn k_i + j
            c = (ends[1:] <= time).sum(axis=0) + 1  # the sojourn holding time: k + c
            kept = c + self.AHEAD <= steps + 1
            i = np.flatnonzero(kept)
            if i.size:
                self._keep(rows[i], ends, i, c[i], k[i])
            # the others step on from the last sojourn before time they reached
            i = np.flatnonzero(~kept)
            last = np.minimum(c[i], steps) - 1
            rows, k, end, time = rows[i], k[i] + last, ends[last, i], time[i]

    def _extend(self, time: np.ndarray, rows: np.ndarray, at: np.ndarray) -> None:
        """Keep AHEAD sojourn ends from the one holding time_i (column at_i < AHEAD of the kept
        ends) on, for unique `rows`: the kept ones are reused, only the missing ones drawn."""
        kept = self._ends[rows].T
        base = self._base[rows]
        new = self._draw(rows, base + self.AHEAD - 1, kept[-1], int(at.max()))
        ends = np.concatenate([kept, new[1:]])  # [j, i]: end of sojourn base_i + j
        self._keep(rows, ends, np.arange(len(rows)), at, base)

    def _keep(
        self, rows: np.ndarray, ends: np.ndarray, i: np.ndarray, c: np.ndarray, k: np.ndarray
    ) -> None:
        """Keep `ends[c_i:c_i + AHEAD, i]` (sojourns k_i + c_i on; c_i ≥ 1) for `rows`."""
        self._ends[rows] = ends[c[:, None] + np.arange(self.AHEAD), i[:, None]]
        self._base[rows] = k + c
        self._before[rows] = ends[c - 1, i]

    def _draw(self, rows: np.ndarray, k: np.ndarray, end: np.ndarray, steps: int) -> np.ndarray:
        """[j, i]: the end of sojourn k_i + j of rows[i] (j = 0 … steps), given that sojourn k_i
        ends at end_i (the state of sojourn k is that of sojourn 0 flipped k times)."""
        return self._steps(rows, k, self._state0[rows] ^ (k & 1).astype(bool), end, steps)[2]

    def up(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        entity = _entities(entity)
        rows = entity.ravel()
        time = self._times(t)
        # the question just asked, asked again (a server's broadcast on the links its uploads
        # used at the same time): the same answer, without a look-up
        asked = self._asked
        one = isinstance(time, float)
        if (
            one
            and asked is not None
            and time == asked[0]
            and len(rows) == len(asked[1])
            and (rows == asked[1]).all()
        ):
            return asked[2].reshape(entity.shape).copy()  # (callers may write to theirs)
        k, _ = self._locate(time, rows)
        up = self._state0[rows] ^ (k & 1).astype(bool)
        self._asked = (time, rows.copy(), up.copy()) if one else None
        return up.reshape(entity.shape)

    def next_switch(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        entity = _entities(entity)
        return self._locate(self._times(t), entity.ravel(), True)[1].reshape(entity.shape)


def _at(time: float | np.ndarray, i: np.ndarray) -> float | np.ndarray:
    """time[i] of per-element times; one time for all (a float) stays as it is."""
    return time if isinstance(time, float) else time[i]


def renewal(
    up_law: Distribution,
    down_law: Distribution,
    n_entities: int,
    key: np.uint64,
    slotted: bool,
) -> RenewalBound:
    """The realisation of an alternating renewal process on `n_entities` entities: rows of
    sojourns kept ahead when there are few entities (`BufferedRenewal`), else stepped lazily."""
    cls = BufferedRenewal if n_entities <= BufferedRenewal.BUFFERED else RenewalBound
    return cls(up_law, down_law, n_entities, key, slotted)


@AVAILABILITY.register("markov")
@dataclass(frozen=True)
class Markov(Availability):
    """Gilbert–Elliott: geometric up and down sojourns in whole slots, stationary from slot 0.

    Per slot an up entity goes down with probability 1/mean_up and a down one comes back with
    probability 1/mean_down; P(up) = mean_up/(mean_up + mean_down). I.i.d. Bernoulli(p) slots
    are the special case mean_up = 1/(1−p), mean_down = 1/p.
    """

    mean_up: float = param(20.0, "mean length of an up sojourn, in slots", ge=1)
    mean_down: float = param(5.0, "mean length of a down sojourn, in slots", ge=1)
    availability: float | None = param(
        None,
        "if set: P(up), with mean_up = mean_down·P/(1−P) (sweeps burstiness at fixed P)",
        gt=0,
        lt=1,
    )

    def __post_init__(self) -> None:
        if self.up_mean < 1:
            raise ValueError(
                f"availability = {self.availability!r} with mean_down = {self.mean_down!r} gives "
                f"mean_up = {self.up_mean:.3g}; it must be ≥ 1 slot (raise mean_down)"
            )

    @property
    def up_mean(self) -> float:
        """The mean up sojourn: `mean_up`, or the one that gives P(up) = `availability`."""
        if self.availability is None:
            return self.mean_up
        return self.mean_down * self.availability / (1.0 - self.availability)

    def bind(
        self,
        n_addresses: int,
        scope: Scope,
        rng: np.random.Generator,
        base_dir: Path | str | None = None,
    ) -> RenewalBound:
        return renewal(
            Geometric(mean=self.up_mean),
            Geometric(mean=self.mean_down),
            n_entities(n_addresses, scope),
            _key(rng),
            slotted=True,
        )


#: Churn defaults: sessions of 100 slots on average, 10 slots offline (91% of the time up).
DEFAULT_SESSION = {"model": "exponential", "mean": 100.0}
DEFAULT_OFFLINE = {"model": "exponential", "mean": 10.0}


@AVAILABILITY.register("churn")
@dataclass(frozen=True)
class Churn(Availability):
    """Sessions (up) and offline periods (down) alternating in continuous time.

    P(up) = E[session]/(E[session] + E[offline]); see the module docstring for the start.
    """

    session: dict | None = param(
        None, "distribution table of a session's length (default exponential, mean 100 slots)"
    )
    offline: dict | None = param(
        None, "distribution table of an offline period's length (default exponential, mean 10)"
    )

    def __post_init__(self) -> None:
        for name in ("session", "offline"):
            if getattr(self, name + "_law").mean <= 0:
                raise ValueError(f"{name}: the mean length must be > 0")

    @property
    def session_law(self) -> Distribution:
        """The distribution of a session's length."""
        return distribution(self.session or DEFAULT_SESSION, "session")

    @property
    def offline_law(self) -> Distribution:
        """The distribution of an offline period's length."""
        return distribution(self.offline or DEFAULT_OFFLINE, "offline")

    def bind(
        self,
        n_addresses: int,
        scope: Scope,
        rng: np.random.Generator,
        base_dir: Path | str | None = None,
    ) -> RenewalBound:
        return renewal(
            self.session_law,
            self.offline_law,
            n_entities(n_addresses, scope),
            _key(rng),
            slotted=False,
        )


# ---------------------------------------------------------------------------------------------
# Traces: intervals read from a CSV file

_STATES = {"up": True, "down": False}


@dataclass(frozen=True)
class TraceRows:
    """The validated rows of a trace file: entity addresses, intervals and states.

    `a` holds the node (node scope) or the smaller address of the pair (link scope, with `b` the
    larger; `b` is −1 for nodes); `line` is each row's line in the file, for messages.
    """

    path: Path
    a: np.ndarray
    b: np.ndarray
    start: np.ndarray
    end: np.ndarray
    up: np.ndarray
    line: np.ndarray


def read_trace(path: Path | str, scope: Scope) -> TraceRows:
    """Read and validate a trace CSV (columns start, end, state and src, dst or node).

    Raises `ConfigError` (one line naming the file, line and column) for a missing file or
    column, a value that is not a number / an address / a state name, end ≤ start, start < 0,
    a self-link, or overlapping intervals of one entity. Address ranges are checked at bind.
    """
    path = Path(path)
    columns = ["src", "dst"] if scope == "link" else ["node"]
    needed = ["start", "end", "state", *columns]
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f, skipinitialspace=True)
            header = [h.strip() for h in reader.fieldnames or []]
            missing = [c for c in needed if c not in header]
            if missing:
                raise ConfigError(
                    f"trace {path}: missing column(s) {', '.join(missing)}; "
                    f"a {scope} trace needs {', '.join(needed)}"
                )
            rows = [
                ({k.strip(): (v or "").strip() for k, v in r.items() if k}, reader.line_num)
                for r in reader
            ]
    except OSError as exc:
        raise ConfigError(f"trace {path}: cannot be read ({exc.strerror})") from None

    def number(row: dict, line: int, col: str, kind: type) -> Any:
        try:
            x = kind(row[col])
        except ValueError:
            what = "an integer address" if kind is int else "a number"
            raise ConfigError(
                f"trace {path}, line {line}: {col} = {row[col]!r}: must be {what}"
            ) from None
        if kind is float and not math.isfinite(x):
            raise ConfigError(f"trace {path}, line {line}: {col} = {row[col]!r}: must be finite")
        return x

    a, b, start, end, up, lines = [], [], [], [], [], []
    for row, line in rows:
        s, e = number(row, line, "start", float), number(row, line, "end", float)
        if s < 0:
            raise ConfigError(f"trace {path}, line {line}: start = {s:g}: must be ≥ 0")
        if e <= s:
            raise ConfigError(f"trace {path}, line {line}: end = {e:g}: must be > start = {s:g}")
        state = row["state"].lower()
        if state not in _STATES:
            raise ConfigError(
                f"trace {path}, line {line}: state = {row['state']!r}: must be 'up' or 'down'"
            )
        if scope == "link":
            x, y = number(row, line, "src", int), number(row, line, "dst", int)
            if x == y:
                raise ConfigError(f"trace {path}, line {line}: src = dst = {x}: not a link")
            x, y = min(x, y), max(x, y)
        else:
            x, y = number(row, line, "node", int), -1
        a.append(x), b.append(y), start.append(s), end.append(e)
        up.append(_STATES[state]), lines.append(line)
    trace = TraceRows(
        path,
        np.array(a, dtype=np.int64),
        np.array(b, dtype=np.int64),
        np.array(start),
        np.array(end),
        np.array(up, dtype=bool),
        np.array(lines, dtype=np.int64),
    )
    _check_overlaps(trace)
    return trace


def _check_overlaps(trace: TraceRows) -> None:
    order = np.lexsort((trace.start, trace.b, trace.a))
    a, b = trace.a[order], trace.b[order]
    same = (a[1:] == a[:-1]) & (b[1:] == b[:-1])
    overlap = same & (trace.start[order][1:] < trace.end[order][:-1])
    if overlap.any():
        i = int(np.flatnonzero(overlap)[0])
        first, second = trace.line[order][i], trace.line[order][i + 1]
        who = f"node {a[i]}" if b[i] < 0 else f"link {a[i]}–{b[i]}"
        raise ConfigError(
            f"trace {trace.path}: lines {first} and {second} overlap (intervals of {who})"
        )


class TraceBound(BoundAvailability):
    """A trace replayed exactly: each entity is in the state of its interval [start, end) that
    contains t, else in the default state.

    The rows become a time-sorted list of events (an interval's start sets its state, its end
    the default; at equal times ends come first so touching intervals hand over), applied up
    to t as time advances; an earlier t replays the events from the beginning.
    """

    per_slot = False  # traces switch at any time

    def __init__(self, entity: np.ndarray, trace: TraceRows, default_up: bool) -> None:
        self.default_up = default_up
        self._ids, row_of = np.unique(entity, return_inverse=True)
        # long-run P(up): the fraction of [0, horizon] up, horizon = the trace's last end
        horizon = float(trace.end.max()) if len(trace.end) else 0.0
        length = trace.end - trace.start
        up_time = np.bincount(row_of, length * trace.up, minlength=len(self._ids))
        covered = np.bincount(row_of, length, minlength=len(self._ids))
        if horizon > 0:
            self._stationary = (up_time + default_up * (horizon - covered)) / horizon
        else:
            self._stationary = np.empty(0)
        self.horizon = horizon
        times = np.concatenate([trace.start, trace.end])
        is_start = np.concatenate([np.ones(len(entity), bool), np.zeros(len(entity), bool)])
        order = np.lexsort((is_start, times))
        self._times = times[order]
        self._row = np.concatenate([row_of, row_of])[order]
        self._value = np.concatenate([trace.up, np.full(len(entity), default_up)])[order]
        self._state = np.full(len(self._ids), default_up)
        self._applied = 0  # events applied so far
        self._t = -math.inf

    def up(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        if np.ndim(t):  # (events are applied up to one time: time by time)
            return _time_by_time(self.up, t, _entities(entity), bool)
        t = float(t)
        if t < self._t:  # asked about the past: replay from the beginning
            self._state[:] = self.default_up
            self._applied = 0
        self._t = t
        upto = int(np.searchsorted(self._times, t, side="right"))
        if upto > self._applied:
            rows = self._row[self._applied : upto]
            values = self._value[self._applied : upto]
            # the last event of each entity decides its state
            _, last_from_end = np.unique(rows[::-1], return_index=True)
            last = len(rows) - 1 - last_from_end
            self._state[rows[last]] = values[last]
            self._applied = upto
        return self._lookup(entity, self._state, self.default_up)

    def stationary(self, entity: np.ndarray) -> np.ndarray:
        return self._lookup(entity, self._stationary, float(self.default_up))

    def _lookup(self, entity: np.ndarray, values: np.ndarray, default: Any) -> np.ndarray:
        entity = _entities(entity)
        rows = np.searchsorted(self._ids, entity)
        inside = rows < len(self._ids)
        rows = np.where(inside, rows, 0)
        found = inside & (self._ids[rows] == entity) if len(self._ids) else inside
        out = np.full(entity.shape, default, dtype=np.asarray(default).dtype)
        out[found] = values[rows[found]]
        return out


@AVAILABILITY.register("trace")
@dataclass(frozen=True)
class Trace(Availability):
    """Replay a CSV trace of up/down intervals [start, end) per link or node.

    Columns: start, end, state ('up'/'down') and src, dst (links) or node (nodes); intervals of
    one entity must not overlap; `default` holds outside them. A relative `file` is resolved
    against the `base_dir` given at bind, else the current directory.
    """

    file: str = param("", "path of the CSV trace (relative: to the study folder)")
    default: Literal["up", "down"] = param("up", "state of an entity outside its intervals")

    def __post_init__(self) -> None:
        if not self.file:
            raise ValueError("file: missing; give the path of the CSV trace")

    def path(self, base_dir: Path | str | None = None) -> Path:
        """The trace file, a relative `file` taken from `base_dir` (default: the current
        directory)."""
        path = Path(self.file)
        return path if path.is_absolute() or base_dir is None else Path(base_dir) / path

    def bind(
        self,
        n_addresses: int,
        scope: Scope,
        rng: np.random.Generator,
        base_dir: Path | str | None = None,
    ) -> TraceBound:
        n_entities(n_addresses, scope)
        trace = read_trace(self.path(base_dir), scope)
        # a holds the node or a pair's smaller address, b (≥ a) the larger one or −1
        bad = (trace.a < 0) | (np.maximum(trace.a, trace.b) >= n_addresses)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            address = trace.a[i] if trace.a[i] < 0 else max(trace.a[i], trace.b[i])
            raise ConfigError(
                f"trace {trace.path}, line {trace.line[i]}: address {address} is out of range; "
                f"the run has addresses 0…{n_addresses - 1}"
            )
        entity = trace.a if scope == "node" else link_entity(trace.a, trace.b, n_addresses)
        return TraceBound(entity, trace, self.default == "up")


def availability(table: Mapping[str, Any] | Availability, where: str) -> Availability:
    """The availability model a study-file table ``{model = "<name>", <params>}`` describes.

    `where` names the table in errors, e.g. ``[network.outages]``; an `Availability` is
    returned unchanged.
    """
    if isinstance(table, Availability):
        return table
    if not isinstance(table, Mapping):
        raise ConfigError(f'{where} = {table!r}: must be a table {{model = "<name>", ...}}')
    if "model" not in table:
        raise ConfigError(
            f"{where}: missing key 'model'; allowed models: {', '.join(AVAILABILITY)}"
        )
    cls = AVAILABILITY.lookup(table["model"], f"{where}: model")
    return build(cls, {k: v for k, v in table.items() if k != "model"}, where)
