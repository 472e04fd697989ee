"""Private-ColME's per-pair state besides the statistic: class beliefs and last releases.

`ClassBeliefs` is C_a for every agent a (χ_a(b) as a matrix), revised when b's release is
tested; `LastReleases` is what a responder b last released to each querier a, re-sent unchanged
when a asks again before b has a new sample (asynchrony only). The statistic T_{b→a} and its
variance terms are `desim.models.colme.statistic.PairStatistic`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from desim.models.colme.positions import RoundRobinPairs

# Columns of a release's payload: b's privatised mean R, b's sample count t_b, the release
# index j, the send time of the query it answers (echoed), and Sch-Var-1's variance release.
VALUE, COUNT, INDEX, ASKED, VARIANCE = range(5)


class ClassBeliefs:
    """C_a^{(t)} of every agent: `included[a, b]` (χ_a(b) = 1) and its row sums.

    With `positions` (`desim.models.colme.positions`) the pairs are numbered by RR position:
    `flat` is then in that order and `included` its M × M shape, [(b − a) mod M, a].
    """

    def __init__(self, included: np.ndarray, positions: RoundRobinPairs | None = None) -> None:
        self.n_included = included.sum(axis=1)  # row sums of `included`, kept current
        if positions is not None:
            included = positions.number(included).reshape(included.shape)
        self.included = included
        self.flat = included.ravel()  # [a·M + b]: a view, the pair index of the protocol

    def revise(self, a: np.ndarray, b: np.ndarray, decision: np.ndarray) -> None:
        """Set χ_a(b) of distinct pairs (a, b) to `decision`."""
        self.revise_pairs(a, a * len(self.n_included) + b, decision)

    def revise_pairs(
        self,
        a: np.ndarray,
        pair: np.ndarray,
        decision: np.ndarray,
        current: np.ndarray | None = None,
    ) -> None:
        """Set χ_a(b) of distinct pairs a·M + b (from agents a) to `decision` (`current`: their
        χ_a(b) now, if the caller has read it)."""
        revise(self.flat, self.n_included, a, pair, decision, current)


def revise(
    flat: np.ndarray,
    n_included: np.ndarray,
    a: np.ndarray,
    pair: np.ndarray | slice,
    decision: np.ndarray,
    current: np.ndarray | None = None,
) -> None:
    """Set flat[pair] (distinct pairs, from agents a; a slice: a run of them) to `decision` and
    keep each agent's count of included pairs, `n_included`, in step; both in place.
    `current` is flat[pair] if the caller has it (read anew otherwise)."""
    run = isinstance(pair, slice)  # (a run of consecutive pairs: read as a slice)
    if current is None:
        current = flat[pair] if run else flat.take(pair)
    changed = (decision != current).nonzero()[0]
    if len(changed):  # decisions settle: most releases change none, so only those are written
        where = changed + pair.start if run else pair.take(changed)
        flat[where] = now = decision.take(changed).astype(bool, copy=False)
        m = len(n_included)
        a = a.take(changed)
        n_included += np.bincount(a[now], minlength=m)
        n_included -= np.bincount(a[~now], minlength=m)


class LastReleases:
    """Each responder's last release to each querier, by the protocol's pair index: the
    columns a repeat re-sends.

    Its index j is not stored: no release of the pair has been made since, so it is still the
    mechanism's count of the pair.
    """

    def __init__(self, n_pairs: int, variance: bool) -> None:
        self.value = np.zeros(n_pairs)
        self.count = np.zeros(n_pairs, dtype=np.int32)  # b's sample count then (< 2³¹ as j)
        self.variance = np.zeros(n_pairs) if variance else None  # Sch-Var-1's variance release

    def keep(self, pair: np.ndarray, payload: np.ndarray) -> None:
        """Keep the new releases of distinct pairs as their last."""
        self.value[pair], self.count[pair] = payload[:, VALUE], payload[:, COUNT]
        if self.variance is not None:
            self.variance[pair] = payload[:, VARIANCE]

    def payload(self, pair: np.ndarray, index: np.ndarray, width: int) -> np.ndarray:
        """Payloads re-sending the last releases of `pair` (ASKED unset), j being `index`."""
        payload = np.empty((len(pair), width))
        payload[:, VALUE], payload[:, COUNT] = self.value[pair], self.count[pair]
        payload[:, INDEX] = index
        if self.variance is not None:
            payload[:, VARIANCE] = self.variance[pair]
        return payload
