"""What Private-ColME reads of the agents' own data: one view of per-slot running sums.

"Now" is a batch of one slot. Ordinarily the view holds that one slot (the running sums as they
are); when the engine hands over several slots at once (`PrivateColME.on_slots`, RR under
asynchrony) it keeps the sums after each slot, and a message delivered at time x reads the
state of slot ⌊x⌋. The protocol maps a batch of messages to slot indices once (`slots`) and
carries them along, so each rule is written once for every delivery mode.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


class OneSlot:
    """The agents' running sums now: a view of one slot, so every slot index reads them."""

    def __init__(self, sums: np.ndarray, sumsq: np.ndarray | None, counts: np.ndarray) -> None:
        # the owner's arrays, which it updates in place (sumsq None: not kept)
        self.sums, self.sumsq, self.counts = sums, sumsq, counts
        self._zeros = _read_only(np.zeros(0, dtype=np.intp))  # `slots`' answers, kept

    def slots(self, when: np.ndarray | None, n: int) -> np.ndarray:
        """The slot index of each of n messages delivered at `when`: 0, the only slot (a
        read-only view of zeros kept between calls: every slot of a run asks for them)."""
        if len(self._zeros) < n:
            self._zeros = _read_only(np.zeros(n, dtype=np.intp))
        return self._zeros[:n]

    def own(
        self, who: np.ndarray, slot: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Sums, sums of squares (None if not kept) and counts of agents `who` as of `slot`."""
        sumsq = None if self.sumsq is None else _of(self.sumsq, who)
        return _of(self.sums, who), sumsq, self.counts_of(who, slot)

    def sums_of(self, who: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Sums of agents `who` as of `slot`."""
        return _of(self.sums, who)

    def counts_of(self, who: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Sample counts of agents `who` as of `slot`: every agent has the same (one sample per
        slot), so a read-only view of one copied value stands for all, not a gather."""
        if len(who) < 1024:  # (a gather costs less than making the view at this size)
            return self.counts[who]
        # (the constructor with stride 0 costs a fraction of np.broadcast_to, at every slot)
        same = np.ndarray((len(who),), buffer=self.counts[:1].copy(), strides=(0,))
        same.flags.writeable = False
        return same

    def clock(self, slot: np.ndarray) -> np.floating:
        """The sample count t as of `slot`, the same for every agent (one sample per slot)."""
        return self.counts[0]


class SlotBatch(OneSlot):
    """The agents' running sums after each slot of a batch t₀ … t₀ + k − 1 (`advance`)."""

    def __init__(self) -> None:
        super().__init__(np.zeros((1, 0)), None, np.zeros(1))
        self.first = 0  # t₀, the first slot of the batch

    def advance(
        self,
        t: int,
        sums: np.ndarray,
        sumsq: np.ndarray | None,
        counts: np.ndarray,
        samples: np.ndarray,
    ) -> None:
        """Take the samples (k × M) of slots t … t + k − 1: keep the sums after each slot and
        bring the running `sums`, `sumsq` (None: not kept) and `counts` to the last, in place."""
        self.first = t
        self.sums = _running(sums, samples)
        sums[:] = self.sums[-1]
        if sumsq is not None:
            self.sumsq = _running(sumsq, samples * samples)
            sumsq[:] = self.sumsq[-1]
        self.counts = counts[0] + np.arange(1.0, len(samples) + 1.0)
        counts += len(samples)

    def slots(self, when: np.ndarray | None, n: int) -> np.ndarray:
        """The slot of the batch each time falls in (no times: now, the batch's last slot)."""
        if when is None:
            return np.full(n, len(self.counts) - 1, dtype=np.intp)
        return (np.floor(when) - self.first).astype(np.intp)

    def own(
        self, who: np.ndarray, slot: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Sums, sums of squares (None if not kept) and counts of agents `who` after `slot`."""
        return (
            self.sums[slot, who],
            None if self.sumsq is None else self.sumsq[slot, who],
            self.counts[slot],
        )

    def sums_of(self, who: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Sums of agents `who` after `slot`."""
        return self.sums[slot, who]

    def counts_of(self, who: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Sample counts of agents `who` after `slot`."""
        return self.counts[slot]

    def clock(self, slot: np.ndarray) -> np.ndarray:
        """The sample count t after each slot."""
        return self.counts[slot]


@lru_cache(maxsize=8)
def every_agent(n: int) -> np.ndarray:
    """0 … n − 1, read-only and kept: who asks with this array (every agent, in order, e.g.
    the queriers of RR on a graph where all query) is answered by a view, not a gather."""
    return _read_only(np.arange(n))


def _of(values: np.ndarray, who: np.ndarray) -> np.ndarray:
    """values[who]: a read-only view for `every_agent` (the same numbers), else a gather."""
    if len(who) == len(values) and who is every_agent(len(who)):
        return _read_only(values.view())
    return values.take(who)


def _read_only(a: np.ndarray) -> np.ndarray:
    """`a`, made read-only (shared between calls, so never written)."""
    a.flags.writeable = False
    return a


def _running(before: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """[i]: `before` plus samples[0], …, samples[i], added one row at a time (as slot-by-slot
    updates add them: the same floats)."""
    out = np.empty((len(samples) + 1, len(before)))
    out[0] = before
    out[1:] = samples
    return np.add.accumulate(out, axis=0, out=out)[1:]
