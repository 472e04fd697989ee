"""How Private-ColME answers queries and takes releases: one strategy per kind of link.

`Synchronous` (ideal links) answers every query with a new release and takes every release at
once, in order: none of the asynchronous bookkeeping runs. `Asynchronous` (latency, losses,
outages, windows, slot batches) repeats b's last release when b has no new sample for a,
discards timed-out and stale releases, takes a pair's releases in order of j, and in a window
keeps the releases until `window_end`, then takes them in the order one-message-per-instant
delivery would (per pair by delivery time, then batch, then j). Both read the agents' state
through the protocol's per-slot view (`desim.models.colme.view`): the slot of each message is
found once, when it is delivered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from desim.kernel.messages import Batch
from desim.models.colme.combination import has_repeats, rounds
from desim.models.colme.pairs import ASKED, INDEX, LastReleases

if TYPE_CHECKING:
    from desim.models.colme.protocol import PrivateColME


def query_ids(t: int | np.ndarray, a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """The ids of queries a → b sent in slots t, (t·M + a)·M + b; a release carries the id
    of the query it answers (`desim.kernel.network.Network.send`), so delays do not depend on
    how sends are grouped."""
    return (np.asarray(t, dtype=np.int64) * m + a) * m + b


@dataclass
class Arrivals:
    """Releases from b to a to be taken: their payloads and the view's slot each is read in."""

    a: np.ndarray
    b: np.ndarray
    payload: np.ndarray
    slot: np.ndarray
    #: Their pairs when the deliverer knows them: a run of consecutive pairs, or indices (else
    #: None: `PrivateColME.pairs_of` finds them).
    pair: slice | np.ndarray | None = None

    def pick(self, index: np.ndarray) -> Arrivals:
        """The arrivals selected by `index` (a mask or indices)."""
        return Arrivals(self.a[index], self.b[index], self.payload[index], self.slot[index])


class Synchronous:
    """Ideal links: every query gets a new release, every release is taken at once in order."""

    def __init__(self, protocol: PrivateColME) -> None:
        self.p = protocol
        # the payload of the queries sent last and their pairs (on a graph; else None), and
        # with pairs numbered by RR position (`positions`) the querier and responder arrays
        # sent with the run of their pairs
        self._asked: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
        self._run: tuple[np.ndarray | None, np.ndarray | None, slice | None] = (None, None, None)
        # the payload of the releases sent last and their pairs (a run, `runs`; or the integers
        # the queries were sent with, on a graph; else None)
        self._answered: tuple[np.ndarray | None, slice | np.ndarray | None] = (None, None)

    def ask(self, t: int, a: np.ndarray, b: np.ndarray, edge: np.ndarray | None = None) -> None:
        """Send slot t's queries a → b (on a graph each carries its edge a → b)."""
        run = None if edge is None or not self.p.runs else self.p.graph.span(edge)
        # a run of consecutive pairs carries a view of their numbers as floats (no new array)
        payload = _edge_payload(edge) if run is None else self.p.graph.floats[run]
        self._asked = (payload, edge)
        if self.p.positions is not None:
            self._run = (a, b, self.p.positions.run(t))
        self.p.ctx.send("query", a, b, payload)

    def answer(self, queries: Batch) -> None:
        """Answer queries a → b with b's new releases."""
        p = self.p
        b, a = queries.dst, queries.src
        sent, edge = self._asked
        run = p.graph.span(queries.payload[:, 0]) if p.runs else None
        asked_a, asked_b, asked_run = self._run
        if a is asked_a and b is asked_b:  # the whole send as sent (the same arrays): its run
            run = asked_run
        if run is not None:
            pair = run  # queries carrying a run of consecutive pairs: that run, as a slice
        elif edge is not None and queries.payload.base is sent and len(queries) == len(edge):
            pair = run = edge  # the whole send, handed over as sent: its pairs as integers
        else:
            pair = p.pairs_of(a, b, queries.payload)
        payload = p.release(b, a, pair, p.view.slots(None, len(b)))
        payload[:, ASKED] = queries.sent_at
        if p.gate is not None and p.gate.budget.action == "stop":  # withheld: not sent
            made = payload[:, INDEX] > 0
            if not made.all():
                b, a, payload, run = b[made], a[made], payload[made], None
        self._answered = (payload, run)
        p.ctx.send("release", b, a, payload)

    def receive(self, releases: Batch) -> None:
        """Take releases (one per pair, each j = κ + 1)."""
        a = releases.dst
        sent, run = self._answered
        got = Arrivals(a, releases.src, releases.payload, self.p.view.slots(None, len(a)))
        if run is not None and releases.payload is sent:  # the answers sent last, as sent
            got.pair = run
        self.p.take(got)

    def window_end(self) -> None:
        """Nothing is kept for a window's end."""


class Asynchronous(Synchronous):
    """Any other links: repeats, timeouts, stale releases, gaps in j, windows, slot batches."""

    def __init__(self, protocol: PrivateColME) -> None:
        super().__init__(protocol)
        n_pairs = protocol.n_pairs
        self.last = LastReleases(n_pairs, protocol.params.variance == "sch-var-1")
        # releases a took from b, by pair (unknown variances: Welch's κ, the Bayesian shape)
        self.received = None if protocol.known else np.zeros(n_pairs, dtype=np.int64)
        self.window: list[Batch] = []  # releases delivered in the current window

    def ask(self, t: int, a: np.ndarray, b: np.ndarray, edge: np.ndarray | None = None) -> None:
        """Send slot t's queries a → b, named for the links' latency (on a graph each carries
        its edge a → b)."""
        ids = query_ids(t, a, b, self.p.ctx.n_agents)
        self.p.ctx.send("query", a, b, _edge_payload(edge), ids=ids)

    def answer(self, queries: Batch) -> None:
        """Answer queries a → b; a release is named by the query it answers and, in a window,
        leaves at that query's exact delivery time."""
        p = self.p
        b, a = queries.dst, queries.src
        pair = p.pairs_of(a, b, queries.payload)
        payload = self._answer(b, a, pair, p.view.slots(queries.delivered_at, len(b)))
        payload[:, ASKED] = queries.sent_at
        ids = query_ids(queries.sent_at, a, b, p.ctx.n_agents)
        at = queries.delivered_at
        if p.gate is not None and p.gate.budget.action == "stop":  # withheld (j = 0): not sent
            made = payload[:, INDEX] > 0
            if not made.all():
                b, a, payload, ids = b[made], a[made], payload[made], ids[made]
                at = None if at is None else at[made]
        p.ctx.send("release", b, a, payload, at=at, ids=ids)

    def _answer(
        self, b: np.ndarray, a: np.ndarray, pair: np.ndarray, slot: np.ndarray
    ) -> np.ndarray:
        """Payloads answering queries a → b (pairs `pair`) that may repeat a pair or find no new
        sample, with b's state after the slot each query arrives in (`slot`, ascending).

        A pair's first query in a slot gets a new release if b has a sample its last release to
        a lacked; every other query gets that last release again (`repeated`). A new release a
        budget withholds keeps j = 0: nothing is sent for it.
        """
        p, m = self.p, self.p.ctx.n_agents
        repeats = len(pair) > 1 and has_repeats(pair)
        if repeats and slot[0] != slot[-1]:
            # slot by slot, in order: a pair asked again in a later slot may have a new sample
            cuts = [0, *(slot[1:] != slot[:-1]).nonzero()[0] + 1, len(slot)]
            return np.concatenate(
                [
                    self._answer(b[i:j], a[i:j], pair[i:j], slot[i:j])
                    for i, j in zip(cuts[:-1], cuts[1:], strict=True)
                ]
            )
        counts = p.view.counts_of(b, slot)
        if not repeats:
            if (counts > self.last.count[pair]).all():  # the usual case
                payload = p.release(b, a, pair, slot)
                made = payload[:, INDEX] > 0
                self.last.keep(pair[made], payload[made])
                return payload
            first = np.arange(len(pair))
        else:
            first = np.sort(np.unique(pair, return_index=True)[1])  # send order: noise draws
        new = first[counts[first] > self.last.count[pair[first]]]
        withheld = np.zeros(len(b), dtype=bool)
        if len(new):
            payload = p.release(b[new], a[new], pair[new], slot[new])
            made = payload[:, INDEX] > 0
            self.last.keep(pair[new[made]], payload[made])
            if not made.all():
                # the pair's other queries of this slot find the same count and the same (or a
                # fuller) budget: one at a time, each would be withheld too
                withheld = np.isin(pair, pair[new[~made]])
                others = withheld.copy()
                others[new] = False
                p.gate.withhold(b[others])
        again = ~withheld
        again[new] = False
        p.repeated += np.bincount(b[again], minlength=m)
        # b's last releases to a (ASKED unset); no release since: j is still the count
        payload = self.last.payload(pair, p.made(b, a, pair), p.release_width)
        payload[withheld, INDEX] = 0
        if p.graph is not None:
            payload[:, p.edge_column] = pair
        return payload

    def receive(self, releases: Batch) -> None:
        """Take releases as they arrive, or keep a window's until its end."""
        if releases.delivered_at is not None:
            self.window.append(releases)
        else:
            self._take_arrivals(releases)

    def window_end(self) -> None:
        """Take the window's releases in the order one-message-per-instant delivery would."""
        if not self.window:
            return
        parts, self.window = self.window, []
        releases = Batch.concat(parts)
        batch_no = np.repeat(np.arange(len(parts)), [len(part) for part in parts])
        self._take_arrivals(releases, releases.delivered_at, batch_no)

    def _take_arrivals(
        self, releases: Batch, when: np.ndarray | None = None, batch_no: np.ndarray | None = None
    ) -> None:
        """Discard timed-out and stale releases, take the others pair by pair in order of j.

        A window's releases come with their delivery times `when` and the number of the batch
        that delivered each: a pair's releases are then taken by time, batch, then j, each
        tested with a's state of the slot it arrived in.
        """
        p, m = self.p, self.p.ctx.n_agents
        a = releases.dst
        got = Arrivals(a, releases.src, releases.payload, p.view.slots(when, len(a)))
        timeout = p.params.timeout
        if math.isfinite(timeout):
            now = p.ctx.now() if when is None else when
            late = now - got.payload[:, ASKED] > timeout
            if late.any():
                p.timed_out += np.bincount(got.a[late], minlength=m)
                got = got.pick(~late)
                if when is not None:
                    when, batch_no = when[~late], batch_no[~late]
        pair = p.pairs_of(got.a, got.b, got.payload, p.edge_column)
        if len(pair) > 1 and has_repeats(pair):
            # several releases of one pair: round r takes the r-th of every pair (lowest j;
            # in a window, earliest)
            j = got.payload[:, INDEX]
            keys = (j, pair) if when is None else (j, batch_no, when, pair)
            for take in rounds(pair, np.lexsort(keys)):
                self._take_fresh(got.pick(take), pair[take])
        elif len(pair):
            self._take_fresh(got, pair)

    def _take_fresh(self, got: Arrivals, pair: np.ndarray) -> None:
        """Take the releases of distinct pairs whose j is above κ; count the others stale."""
        p = self.p
        last = p.stat.last_index(pair)
        fresh = got.payload[:, INDEX] > last
        if not fresh.all():
            p.stale += np.bincount(got.a[~fresh], minlength=p.ctx.n_agents)
            got, pair, last = got.pick(fresh), pair[fresh], last[fresh]
        if len(pair):
            taken = None
            if self.received is not None:
                taken = self.received[pair] + 1
                self.received[pair] = taken
            p.take(got, last.astype(np.int64), taken)


def _edge_payload(edge: np.ndarray | None) -> np.ndarray | None:
    """A query's payload: nothing, or on a graph the edge a → b it crosses (one column)."""
    return None if edge is None else edge.astype(float)
