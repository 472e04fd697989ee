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

Markov and churn are alternating renewal processes: sojourn k of an entity has length
``ppf(counter_uniform(key, (k + 1)·n_entities + entity))`` (`SojournSequence`). Two models read
that one sequence and give the same floats (sojourn ends are summed in sequence from time 0
whatever the blocks they are drawn in): `SteppedRenewal` holds per entity its current sojourn
and steps it forward in vectorised blocks, in arrays indexed by entity or, for large entity
spaces (n_addresses² is 10⁸ links for 10⁴ addresses), only for the entities asked so far
(`RowIndex`); `BufferedRenewal`, for few entities (every link of a few hundred agents), keeps
the ends of each entity's next sojourns, so a question is one look-up per entity in its row.
`renewal` picks one by the size of the entity space. Times should be non-decreasing
(simulation time); an earlier time is answered correctly by replaying the entity from time 0.
"""

from __future__ import annotations

import array
import csv
import functools
import hashlib
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from desim.kernel.links import counter_uniform
from desim.kernel.params import ConfigError, build, param
from desim.kernel.registry import AVAILABILITY
from desim.kernel.rowindex import RowIndex
from desim.network_models.distributions import Distribution, Geometric, distribution
from desim.network_models.tracefile import plain_rows

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
    """The distinct `ids`, ascending (a sort: cheaper than `np.unique` on thousands)."""
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
        """Always up, whatever the entities."""
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
        """Whether each entity is up in the slot ⌊t⌋ (one time, or one per entity)."""
        entity = _entities(entity)
        slot = np.floor(t).astype(np.uint64) if np.ndim(t) else np.uint64(math.floor(t))
        counter = slot * self._n + entity.astype(np.uint64)
        return counter_uniform(self._key, counter) < self.p

    def stationary(self, entity: np.ndarray) -> np.ndarray:
        """p for every entity."""
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
        """I.i.d. slots of the `scope` entities, keyed by one draw of `rng`."""
        return BernoulliBound(self.p, n_entities(n_addresses, scope), _key(rng))


# ---------------------------------------------------------------------------------------------
# Alternating renewal processes (Markov in slots, churn in continuous time), realised lazily:
# one sojourn sequence per entity, read by a stepped model or by a look-ahead (buffered) one.
# The defaults below choose storage: they change speed and memory, never an answer.

#: `renewal` keeps sojourns ahead (`BufferedRenewal`) for at most this many entities (every link
#: of 255 agents), else steps them (`SteppedRenewal`).
BUFFERED_UP_TO = 1 << 16
#: `SteppedRenewal` indexes its per-entity arrays by entity up to this many entities: zeroed
#: memory is committed only where touched (26 bytes an entity, 218 MB at most, less than the hash
#: index once most links are asked); beyond, it holds the entities seen so far (`RowIndex`).
DENSE_UP_TO = 1 << 23
#: The sojourn ends `BufferedRenewal` keeps per entity (AHEAD·BUFFERED_UP_TO floats: 16 MiB).
AHEAD = 32
#: `BufferedRenewal` extends worn rows (see `extend_past`) only in questions about at most this
#: many rows: some row runs out in nearly every larger question anyway, and rewriting every worn
#: row there costs more than the renewals it saves.
EXTEND_UP_TO = 1024


class SojournSequence:
    """The sojourns of an alternating renewal process per entity, drawn counter-based.

    Sojourn 0 of entity e starts at time 0, up with probability p_up = E[up]/(E[up] + E[down])
    (counter e); sojourn k ≥ 0 lasts ``ppf(counter_uniform(key, (k + 1)·n_entities + e))`` of
    `up_law` or `down_law` by its state, and states alternate. So any sojourn of any entity is a
    fixed function of (key, entity, k), however and in whichever blocks a model reads them.
    """

    def __init__(
        self, up_law: Distribution, down_law: Distribution, n_entities: int, key: np.uint64
    ) -> None:
        self.up_law = up_law
        self.down_law = down_law
        self.p_up = up_law.mean / (up_law.mean + down_law.mean)
        self.n_entities = n_entities
        self._n = np.uint64(n_entities)
        self._key = key

    def first_state(self, ids: np.ndarray) -> np.ndarray:
        """Whether sojourn 0 of each entity is up."""
        return counter_uniform(self._key, ids.astype(np.uint64)) < self.p_up

    def first(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The state and end of sojourn 0 of each entity."""
        state = self.first_state(ids)
        return state, self.lengths(ids, np.zeros(len(ids), dtype=np.int64), state)

    def lengths(self, ids: np.ndarray, k: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The length of sojourn k of each entity, in `state` (ids may be one per column of k)."""
        # counter (k + 1)·n_entities + entity is the entity's sojourn k; counter `entity` its
        # initial state
        counter = k.astype(np.uint64)
        counter += np.uint64(1)
        counter *= self._n
        counter += ids.astype(np.uint64)  # (ids may be one per column of k: broadcast)
        u = counter_uniform(self._key, counter)
        if isinstance(self.up_law, Geometric) and isinstance(self.down_law, Geometric):
            return Geometric.ppf_of(u, np.where(state, self.up_law.log_q, self.down_law.log_q))
        out = np.empty(u.shape)
        out[state] = self.up_law.ppf(u[state])
        out[~state] = self.down_law.ppf(u[~state])
        return out

    def steps(
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
        ends[1:] = self.lengths(ids, kk, state)  # (ids broadcast along the steps)
        np.add.accumulate(ends, axis=0, out=ends)
        return kk, state, ends

    def block(self, gap: float, n_behind: int) -> int:
        """How many sojourn steps to draw at once: enough to cover `gap` on average (two per
        mean cycle, plus a margin), at most 4096 steps and 2²² draws in all."""
        cycle = self.up_law.mean + self.down_law.mean
        want = math.ceil(2.5 * gap / cycle) + 2
        return max(1, min(want, 4096, (1 << 22) // n_behind))


class RenewalBound(BoundAvailability):
    """An alternating renewal process per entity (a `SojournSequence`) read at time t, or at its
    slot ⌊t⌋ when `slotted`: what `SteppedRenewal` and `BufferedRenewal` share. They read the
    same sojourns in different ways and give the same floats."""

    def __init__(self, sojourns: SojournSequence, slotted: bool) -> None:
        self.sojourns = sojourns
        self.p_up = sojourns.p_up
        self.slotted = slotted
        self.per_slot = slotted
        self._latest = -math.inf  # the latest time asked: no sojourn starts after it

    def _time(self, t: float) -> float:
        return float(math.floor(t)) if self.slotted else float(t)

    def _times(self, t: float | np.ndarray) -> float | np.ndarray:
        """The time(s) the chain is read at: t, or its slot ⌊t⌋ (one time or one per entity)."""
        if isinstance(t, float | int) or not np.ndim(t):
            return self._time(t)
        t = np.asarray(t, dtype=float).ravel()
        return np.floor(t) if self.slotted else t

    def next_switch(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        """The end of each entity's sojourn containing t: when its state next changes (a whole
        slot for Markov; a zero-length sojourn in between may leave it unchanged)."""
        raise NotImplementedError

    def stationary(self, entity: np.ndarray) -> np.ndarray:
        """E[up]/(E[up] + E[down]) for every entity."""
        return np.full(np.shape(entity), self.p_up)


class SteppedRenewal(RenewalBound):
    """Renewal availability stepped lazily: per entity the index k of its current sojourn, the
    sojourn's state, start and end, moved forward to each time asked.

    Up to `dense_up_to` entities these are dense arrays indexed by entity; beyond, they hold
    only the entities asked so far, in order of first sight, found through a `RowIndex`.
    Advancing to t loops over blocks of sojourn steps, each vectorised over the entities still
    behind t, so an entity asked rarely catches up in one or two numpy passes.
    """

    def __init__(
        self, sojourns: SojournSequence, slotted: bool, dense_up_to: int = DENSE_UP_TO
    ) -> None:
        super().__init__(sojourns, slotted)
        n = sojourns.n_entities
        #: Whether the per-entity arrays are indexed by entity (else by row of first sight).
        self.dense = n <= dense_up_to
        size = n if self.dense else 0
        # per entity (dense) or per entity seen so far (sparse: rows found by `_index`, the
        # entity of each row in `_ids`): the index k, state, start and end of its current sojourn
        self._index = None if self.dense else RowIndex()
        self._ids: np.ndarray | None = None if self.dense else np.empty(0, dtype=np.int64)
        self._seen = np.zeros(size, dtype=bool)
        self._k = np.zeros(size, dtype=np.int64)
        self._state = np.zeros(size, dtype=bool)
        self._start = np.zeros(size)
        self._end = np.zeros(size)

    def _entity(self, rows: np.ndarray) -> np.ndarray:
        return rows if self._ids is None else self._ids[rows]

    def _rows(self, entity: np.ndarray) -> np.ndarray:
        """The rows of `entity` in the per-entity arrays, starting the entities not seen yet."""
        if self._ids is None:
            fresh = ~self._seen[entity]
            if fresh.any():
                new = _distinct(entity[fresh])
                self._seen[new] = True
                self._state[new], self._end[new] = self.sojourns.first(new)
            return entity
        rows = self._index.find(entity)
        new = rows < 0
        if not new.any():
            return rows
        fresh = _distinct(entity[new])
        at = self._index.add(fresh)
        if len(self._index) > len(self._ids):  # room for the new rows: double the arrays
            self._grow(max(len(self._index), 2 * len(self._ids)))
        self._ids[at], self._k[at], self._start[at] = fresh, 0, 0.0
        self._state[at], self._end[at] = self.sojourns.first(fresh)
        rows[new] = at[np.searchsorted(fresh, entity[new])]
        return rows

    def _grow(self, size: int) -> None:
        """Make the sparse per-entity arrays `size` rows long, keeping what they hold."""
        for name in ("_ids", "_k", "_state", "_start", "_end"):
            held = getattr(self, name)
            grown = np.zeros(size, dtype=held.dtype)
            grown[: len(held)] = held
            setattr(self, name, grown)

    def _advance(self, time: float, rows: np.ndarray) -> None:
        """Move every entity of `rows` to the sojourn that contains `time`."""
        if time < self._latest:  # a sojourn may start after `time`: check
            back = rows[self._start[rows] > time]
            if back.size:  # asked about the past: replay from time 0
                back = _distinct(back)
                state, end = self.sojourns.first(self._entity(back))
                self._k[back], self._state[back] = 0, state
                self._start[back], self._end[back] = 0.0, end
        else:
            self._latest = time
        # (an entity asked twice is stepped twice, to the same state: cheaper than `np.unique`)
        behind = rows[self._end[rows] <= time]
        while behind.size:  # a block of sojourn steps for every entity still behind
            steps = self.sojourns.block(time - self._end[behind].min(), len(behind))
            k, state, ends = self.sojourns.steps(
                self._entity(behind), self._k[behind], self._state[behind], self._end[behind], steps
            )
            # the sojourn containing `time` is the first whose end is after it (ends ascend)
            last = np.minimum((ends[1:] <= time).sum(axis=0), steps - 1)
            at = np.arange(len(behind))
            self._k[behind], self._state[behind] = k[last, at], state[last, at]
            self._start[behind], self._end[behind] = ends[last, at], ends[last + 1, at]
            behind = behind[ends[last + 1, at] <= time]

    def up(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        """Whether each entity is up at t (one time, or one per entity: stepped time by time)."""
        entity = _entities(entity)
        if np.ndim(t):  # (stepping moves the entities asked to one time: time by time)
            return _time_by_time(self.up, self._times(t), entity, bool)
        rows = self._rows(entity.ravel())
        self._advance(self._time(t), rows)
        return self._state[rows].reshape(entity.shape)

    def next_switch(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        """The end of each entity's sojourn containing t (see `RenewalBound.next_switch`)."""
        entity = _entities(entity)
        if np.ndim(t):
            return _time_by_time(self.next_switch, self._times(t), entity, float)
        rows = self._rows(entity.ravel())
        self._advance(self._time(t), rows)
        return self._end[rows].reshape(entity.shape)


class BufferedRenewal(RenewalBound):
    """Renewal availability for small entity spaces, read ahead: the ends of each entity's next
    `ahead` sojourns are kept, so a question is a look-up in that row, not a step of the chain,
    and each entity may be asked at its own time (`per_message`: a window's messages in one
    question).

    Row e of `_ends` holds the ends of sojourns `_base[e]` … `_base[e]` + ahead − 1 of entity e
    (−∞ and base −1: not started), `_before[e]` the start of sojourn `_base[e]`; the state of
    sojourn k is that of sojourn 0 flipped k times. Rows are renewed in blocks as they run out.
    Ends are summed in sequence from time 0 whatever blocks they are drawn in, so every answer
    equals `SteppedRenewal`'s.

    `extend_past`: a renewal also extends the rows asked with it whose time is past this many
    of their kept ends (default ahead // 8), so that rows run out, and renewals come, less often;
    `extend_up_to`: questions about more rows than this extend none.
    """

    def __init__(
        self,
        sojourns: SojournSequence,
        slotted: bool,
        ahead: int = AHEAD,
        extend_past: int | None = None,
        extend_up_to: int = EXTEND_UP_TO,
    ) -> None:
        super().__init__(sojourns, slotted)
        n = sojourns.n_entities
        self.ahead = ahead
        self.extend_past = ahead // 8 if extend_past is None else extend_past
        self.extend_up_to = extend_up_to
        self._ends = np.full((n, ahead), -np.inf)
        self._base = np.full(n, -1, dtype=np.int64)
        self._before = np.zeros(n)
        self._state0 = np.zeros(n, dtype=bool)
        #: (time, rows, answer) of the last question `up` was asked at one time, or None.
        self._asked: tuple[float, np.ndarray, np.ndarray] | None = None
        self._marked = np.zeros(n, dtype=bool)  # all False between calls (`_renew`)

    def _locate(
        self, time: float | np.ndarray, rows: np.ndarray, ends_too: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The index k and (if `ends_too`) the end of each entity's sojourn that contains `time`
        (one time, or one per row; an entity may be asked at several times)."""
        if not rows.size:
            return np.empty(0, dtype=np.int64), np.empty(0)
        one = isinstance(time, float)  # (not `np.ndim`: a Python-level wrapper)
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
            done = at < self.ahead
            i = todo[done]
            k[i], end[i] = self._base[rows[i]] + at[done], ends[np.flatnonzero(done), at[done]]
            todo = todo[~done]
            if not todo.size:
                return k, end
            # renew the rows that ran out (or never started) at their earliest time asked, and
            # extend every row past `extend_past`; an entity asked far apart takes more rounds
            extend = len(rows) <= self.extend_up_to
            worn = i[at[done] >= self.extend_past] if extend else i[:0]
            self._renew(self._earliest(rows[todo], _at(time, todo)), rows[worn], _at(time, worn))
            ends, at, _ = self._position(_at(time, todo), rows[todo])

    @staticmethod
    def _earliest(rows: np.ndarray, time: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distinct `rows` and the earliest time each is asked at."""
        if isinstance(time, float):  # (a sort, not `np.unique`: cheaper on hundreds)
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
        (`ahead`: none), and whether every row has one."""
        ends = self._ends.take(rows, axis=0)
        later = ends > (time if isinstance(time, float) else time[:, None])
        at = later.argmax(axis=1)  # ends ascend: the first True, or 0 when there is none
        held = later[:, -1]
        if held.all():
            return ends, at, True
        at[~held] = self.ahead
        return ends, at, False

    def _renew(
        self, out: tuple[np.ndarray, np.ndarray], worn: np.ndarray, worn_time: float | np.ndarray
    ) -> None:
        """Renew the distinct rows `out[0]` (run out, or not started) at times `out[1]`, then
        extend the rows `worn` (past `extend_past` kept ends at `worn_time`) not among them."""
        out, time = out
        base = self._base[out]
        fresh = base < 0
        if fresh.any():
            new = out[fresh]
            self._state0[new] = self.sojourns.first_state(new)
        # from sojourn −1 "ending" at 0 (not started), else from the last kept one
        k = np.where(fresh, -1, base + self.ahead - 1)
        self._catch_up(time, out, k, np.where(fresh, 0.0, self._ends[out, -1]))
        self._marked[out] = True  # (a mask, not `np.isin`, which sorts both)
        keep = ~self._marked[worn]
        self._marked[out] = False
        if keep.any():
            rows, time = self._earliest(worn[keep], _at(worn_time, np.flatnonzero(keep)))
            self._extend(time, rows, self._position(time, rows)[1])

    def _catch_up(self, time: np.ndarray, rows: np.ndarray, k: np.ndarray, end: np.ndarray) -> None:
        """Keep `ahead` sojourn ends from the one holding time_i on, for unique `rows` whose
        sojourn k_i (−1: none before sojourn 0) ends at end_i ≤ time_i."""
        while rows.size:
            steps = self.sojourns.block(float(np.max(time - end)), len(rows)) + self.ahead
            ends = self._draw(rows, k, end, steps)  # [j, i]: end of sojourn k_i + j
            c = (ends[1:] <= time).sum(axis=0) + 1  # the sojourn holding time: k + c
            kept = c + self.ahead <= steps + 1
            i = np.flatnonzero(kept)
            if i.size:
                self._keep(rows[i], ends, i, c[i], k[i])
            # the others step on from the last sojourn before time they reached
            i = np.flatnonzero(~kept)
            last = np.minimum(c[i], steps) - 1
            rows, k, end, time = rows[i], k[i] + last, ends[last, i], time[i]

    def _extend(self, time: np.ndarray, rows: np.ndarray, at: np.ndarray) -> None:
        """Keep `ahead` sojourn ends from the one holding time_i (column at_i < ahead of the kept
        ends) on, for unique `rows`: the kept ones are reused, only the missing ones drawn."""
        kept = self._ends[rows].T
        base = self._base[rows]
        new = self._draw(rows, base + self.ahead - 1, kept[-1], int(at.max()))
        ends = np.concatenate([kept, new[1:]])  # [j, i]: end of sojourn base_i + j
        self._keep(rows, ends, np.arange(len(rows)), at, base)

    def _keep(
        self, rows: np.ndarray, ends: np.ndarray, i: np.ndarray, c: np.ndarray, k: np.ndarray
    ) -> None:
        """Keep `ends[c_i:c_i + ahead, i]` (sojourns k_i + c_i on; c_i ≥ 1) for `rows`."""
        self._ends[rows] = ends[c[:, None] + np.arange(self.ahead), i[:, None]]
        self._base[rows] = k + c
        self._before[rows] = ends[c - 1, i]

    def _draw(self, rows: np.ndarray, k: np.ndarray, end: np.ndarray, steps: int) -> np.ndarray:
        """[j, i]: the end of sojourn k_i + j of rows[i] (j = 0 … steps), given that sojourn k_i
        ends at end_i (the state of sojourn k is that of sojourn 0 flipped k times)."""
        state = self._state0[rows] ^ (k & 1).astype(bool)
        return self.sojourns.steps(rows, k, state, end, steps)[2]

    def up(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        """Whether each entity is up at t (one time, or one per entity), read from its kept row."""
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
        """The end of each entity's sojourn containing t (see `RenewalBound.next_switch`)."""
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
    buffered_up_to: int = BUFFERED_UP_TO,
    **options: Any,
) -> RenewalBound:
    """The realisation of an alternating renewal process on `n_entities` entities (sojourn
    laws `up_law` and `down_law`, draws keyed by `key`): sojourns kept ahead when there are at
    most `buffered_up_to` entities (`BufferedRenewal`), else stepped lazily (`SteppedRenewal`).
    `options` go to the model chosen; the answers are the same floats whichever it is."""
    sojourns = SojournSequence(up_law, down_law, n_entities, key)
    if n_entities <= buffered_up_to:
        return BufferedRenewal(sojourns, slotted, **options)
    return SteppedRenewal(sojourns, slotted, **options)


class RenewalAvailability(Availability):
    """Up and down sojourns of every entity alternating as a renewal process (`renewal`)."""

    #: Whether the state is read at the slot ⌊t⌋ (sojourns in whole slots), else at t.
    slotted: ClassVar[bool] = False

    def laws(self) -> tuple[Distribution, Distribution]:
        """The distributions of an up sojourn's length and of a down sojourn's length."""
        raise NotImplementedError

    def bind(
        self,
        n_addresses: int,
        scope: Scope,
        rng: np.random.Generator,
        base_dir: Path | str | None = None,
    ) -> RenewalBound:
        """The renewal process of the `scope` entities, keyed by one draw of `rng`."""
        return renewal(*self.laws(), n_entities(n_addresses, scope), _key(rng), self.slotted)


@AVAILABILITY.register("markov")
@dataclass(frozen=True)
class Markov(RenewalAvailability):
    """Gilbert–Elliott: geometric up and down sojourns in whole slots, stationary from slot 0.

    Per slot an up entity goes down with probability 1/mean_up and a down one comes back with
    probability 1/mean_down; P(up) = mean_up/(mean_up + mean_down). I.i.d. Bernoulli(p) slots
    are the special case mean_up = 1/(1−p), mean_down = 1/p.
    """

    slotted: ClassVar[bool] = True

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

    def laws(self) -> tuple[Distribution, Distribution]:
        """Geometric up and down sojourns of means `up_mean` and `mean_down` slots."""
        return Geometric(mean=self.up_mean), Geometric(mean=self.mean_down)


#: Churn defaults: sessions of 100 slots on average, 10 slots offline (91% of the time up).
DEFAULT_SESSION = {"model": "exponential", "mean": 100.0}
DEFAULT_OFFLINE = {"model": "exponential", "mean": 10.0}


@AVAILABILITY.register("churn")
@dataclass(frozen=True)
class Churn(RenewalAvailability):
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

    def laws(self) -> tuple[Distribution, Distribution]:
        """The session and offline laws."""
        return self.session_law, self.offline_law


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
    A file read before with the same content is not parsed again: a study validates it, then
    builds each set-up from it.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:  # (in pieces: a file parsed before is not held whole)
            key = (path, scope, hashlib.file_digest(f, "blake2b").hexdigest())
        with _TRACES_LOCK:
            trace = _TRACES.get(key)
        data = path.read_bytes() if trace is None else b""
    except OSError as exc:
        raise ConfigError(f"trace {path}: cannot be read ({exc.strerror})") from None
    if trace is None:
        key = (path, scope, hashlib.blake2b(data).hexdigest())  # what is parsed, if it changed
        index, rows = _csv_rows(path, scope)
        arrays = plain_rows(data, index, scope) if len(data) >= PLAIN_TRACE_BYTES else None
        del data  # the overlap check's sorted copies take its place
        if arrays is None:  # not plain: row by row, which names what is wrong
            arrays = _parse_rows(path, scope, index, rows)
        trace = TraceRows(path, **arrays)
        _check_overlaps(trace)
    with _TRACES_LOCK:  # the most recent read last; the oldest forgotten
        _TRACES.pop(key, None)
        _TRACES[key] = trace
        while len(_TRACES) > _TRACES_KEPT:
            del _TRACES[next(iter(_TRACES))]
    return trace


#: Traces parsed (by path, scope and hash of the content), the most recently read last.
_TRACES: dict[tuple[Path, str, str], TraceRows] = {}
_TRACES_LOCK = threading.Lock()
#: How many parsed traces are kept: a study reads one or two traces, each many times.
_TRACES_KEPT = 2


#: Smallest trace file read in bulk (smaller ones are read row by row, as fast as pyarrow's
#: import).
PLAIN_TRACE_BYTES = 1 << 20


def _parse_rows(
    path: Path, scope: Scope, index: list[int], rows: Iterator[tuple[list[str], int]]
) -> dict[str, np.ndarray]:
    """The `TraceRows` columns of a trace file read row by row, each row checked."""
    columns = {name: array.array(code) for name, code in _TRACE_COLUMNS.items()}
    append = [values.append for values in columns.values()]
    for row, line in rows:
        parsed = (
            _quick_row(row, index, scope)
            or _trace_row(path, _named(row, index, scope), line, scope)[:5]
        )
        try:
            for add, x in zip(append, (*parsed, line), strict=True):
                add(x)
        except OverflowError:  # an address beyond 64 bits: no run has it
            raise ConfigError(
                f"trace {path}, line {line}: address {max(parsed[:2], key=abs)} is out of range"
            ) from None
    arrays = {
        name: np.frombuffer(values, dtype=_TRACE_COLUMNS_DTYPE[name])
        for name, values in columns.items()
    }
    for a in arrays.values():
        a.flags.writeable = False  # shared by every reader of the file (the cache)
    return arrays


def _quick_row(row: list[str], index: list[int], scope: Scope) -> tuple | None:
    """(a, b, start, end, up) of a sound row, or None: `_trace_row` then says what is wrong
    (this is its common case without the checks' messages; a trace has millions of rows).
    `index` holds the positions of start, end, state and node (or src and dst)."""
    try:
        if scope == "link":
            x, y = int(row[index[3]]), int(row[index[4]])
            if x == y:
                return None
            x, y = min(x, y), max(x, y)
        else:
            x, y = int(row[index[3]]), -1
        s, e = float(row[index[0]]), float(row[index[1]])
        up = _STATES[row[index[2]].strip().lower()]
    except (ValueError, KeyError, IndexError):
        return None
    return (x, y, s, e, up) if 0 <= s < e < math.inf else None


def _named(row: list[str], index: list[int], scope: Scope) -> dict[str, str]:
    """A row as `_trace_row` reads it: stripped values by column name ('' when missing)."""
    names = ["start", "end", "state", "src", "dst"] if scope == "link" else _NODE_NAMES
    return {
        name: row[i].strip() if i < len(row) else "" for name, i in zip(names, index, strict=True)
    }


_NODE_NAMES = ["start", "end", "state", "node"]

#: TraceRows' columns as they are gathered (array codes) and kept (numpy types).
_TRACE_COLUMNS = {"a": "q", "b": "q", "start": "d", "end": "d", "up": "b", "line": "q"}
_TRACE_COLUMNS_DTYPE = {
    "a": np.int64,
    "b": np.int64,
    "start": float,
    "end": float,
    "up": bool,
    "line": np.int64,
}


def _csv_rows(path: Path, scope: Scope) -> tuple[list[int], Iterator[tuple[list[str], int]]]:
    """The positions of the columns a `scope` trace needs (start, end, state, then node or
    src and dst), checked to be there, and the file's rows with their line numbers."""
    columns = ["src", "dst"] if scope == "link" else ["node"]
    needed = ["start", "end", "state", *columns]
    try:
        with path.open(newline="") as f:
            header = next(csv.reader(f, skipinitialspace=True), [])
    except OSError as exc:
        raise ConfigError(f"trace {path}: cannot be read ({exc.strerror})") from None
    # as a csv.DictReader keyed by stripped names: a repeated name's last column wins
    where = {name.strip(): i for i, name in enumerate(header) if name}
    missing = [c for c in needed if c not in where]
    if missing:
        raise ConfigError(
            f"trace {path}: missing column(s) {', '.join(missing)}; "
            f"a {scope} trace needs {', '.join(needed)}"
        )
    return [where[c] for c in needed], _rows(path)


def _rows(path: Path) -> Iterator[tuple[list[str], int]]:
    """The rows after the header of a trace file, blank lines skipped, with line numbers."""
    try:
        with path.open(newline="") as f:
            reader = csv.reader(f, skipinitialspace=True)
            next(reader, None)
            for r in reader:
                if r:
                    yield r, reader.line_num
    except OSError as exc:
        raise ConfigError(f"trace {path}: cannot be read ({exc.strerror})") from None


def _trace_row(
    path: Path, row: dict[str, str], line: int, scope: Scope
) -> tuple[int, int, float, float, bool, int]:
    """One validated row: (a, b, start, end, up, line) as `TraceRows` holds them."""
    s, e = _number(path, row, line, "start", float), _number(path, row, line, "end", float)
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
        x, y = _number(path, row, line, "src", int), _number(path, row, line, "dst", int)
        if x == y:
            raise ConfigError(f"trace {path}, line {line}: src = dst = {x}: not a link")
        x, y = min(x, y), max(x, y)
    else:
        x, y = _number(path, row, line, "node", int), -1
    return x, y, s, e, _STATES[state], line


def _number(path: Path, row: dict[str, str], line: int, col: str, kind: type) -> Any:
    """Column `col` of a trace row as a `kind` (int: an address; float: a finite number)."""
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


def _check_overlaps(trace: TraceRows) -> None:
    # rows sorted by entity, then start (ties in file order); an entity's interval overlaps
    # the next one of the same entity when it ends after that one starts
    key = _entity_key(trace)
    if key is None:
        order = np.lexsort((trace.start, trace.b, trace.a))
        a, b = trace.a[order], trace.b[order]
        same = (a[1:] == a[:-1]) & (b[1:] == b[:-1])
        del a, b
    else:
        order = np.lexsort((trace.start, key))
        key = key[order]
        same = key[1:] == key[:-1]
        del key
    same &= trace.start[order][1:] < trace.end[order][:-1]
    if same.any():
        i = int(np.flatnonzero(same)[0])
        first, second = order[i], order[i + 1]
        a, b = trace.a[first], trace.b[first]
        who = f"node {a}" if b < 0 else f"link {a}–{b}"
        raise ConfigError(
            f"trace {trace.path}: lines {trace.line[first]} and {trace.line[second]} overlap "
            f"(intervals of {who})"
        )


def _entity_key(trace: TraceRows) -> np.ndarray | None:
    """One integer per row, ordered as the rows' entities (a, then b), when it fits 62 bits
    (sorting by it is one sort less than by a and b); None when it does not."""
    a, b = trace.a, trace.b
    if not len(a):
        return None
    low_a, low_b = int(a.min()), int(b.min())
    span_b = int(b.max()) - low_b + 1
    if (int(a.max()) - low_a + 1) * span_b >= 2**62:
        return None
    key = a - low_a
    key *= span_b
    key += b
    key -= low_b
    return key


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
        self._entity, self._trace = entity, trace
        # long-run P(up): the fraction of [0, horizon] up, horizon = the trace's last end
        self.horizon = float(trace.end.max()) if len(trace.end) else 0.0
        self._applied = 0  # events applied so far
        self._t = -math.inf

    # The entity index, the long-run P(up) and the events are made when first asked: a study
    # binds each set-up to check it (`desim validate`) and asks nothing of most of them.

    @functools.cached_property
    def _index(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct entities and the position of each row's entity among them."""
        return np.unique(self._entity, return_inverse=True)

    @property
    def _ids(self) -> np.ndarray:
        return self._index[0]

    @functools.cached_property
    def _stationary(self) -> np.ndarray:
        """Each entity's fraction of [0, horizon] up."""
        trace, (ids, row_of), horizon = self._trace, self._index, self.horizon
        if horizon <= 0:
            return np.empty(0)
        length = trace.end - trace.start
        up_time = np.bincount(row_of, length * trace.up, minlength=len(ids))
        covered = np.bincount(row_of, length, minlength=len(ids))
        return (up_time + self.default_up * (horizon - covered)) / horizon

    @functools.cached_property
    def _events(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(times, entity positions, states) of every interval's start and end, time-sorted."""
        trace, row_of, n = self._trace, self._index[1], len(self._entity)
        times = np.concatenate([trace.start, trace.end])
        is_start = np.concatenate([np.ones(n, bool), np.zeros(n, bool)])
        order = np.lexsort((is_start, times))
        rows = np.concatenate([row_of, row_of])[order]
        values = np.concatenate([trace.up, np.full(n, self.default_up)])[order]
        return times[order], rows, values

    @functools.cached_property
    def _state(self) -> np.ndarray:
        """Each entity's state at the time last asked."""
        return np.full(len(self._ids), self.default_up)

    def up(self, t: float | np.ndarray, entity: np.ndarray) -> np.ndarray:
        """Whether each entity is up at t (one time, or one per entity), as the trace says."""
        if np.ndim(t):  # (events are applied up to one time: time by time)
            return _time_by_time(self.up, t, _entities(entity), bool)
        t = float(t)
        if t < self._t:  # asked about the past: replay from the beginning
            self._state[:] = self.default_up
            self._applied = 0
        self._t = t
        times, row, value = self._events
        upto = int(np.searchsorted(times, t, side="right"))
        if upto > self._applied:
            rows = row[self._applied : upto]
            values = value[self._applied : upto]
            # the last event of each entity decides its state
            _, last_from_end = np.unique(rows[::-1], return_index=True)
            last = len(rows) - 1 - last_from_end
            self._state[rows[last]] = values[last]
            self._applied = upto
        return self._lookup(entity, self._state, self.default_up)

    def stationary(self, entity: np.ndarray) -> np.ndarray:
        """The fraction of the trace's span each entity is up (the default state outside)."""
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
        """The trace read from its file, its addresses checked against the run's."""
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
