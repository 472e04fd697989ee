"""Adversaries and robust aggregates for the C-ColME family on a graph (docs/adversaries.md).

**Adversaries** (`[adversaries]`, `desim.models.adversaries`). An adversary b runs the protocol
on a corrupted privatised running mean: X̃_b is replaced by what its behaviour says (shift,
flip, mimic, collude), every slot, before anything is sent, so that its state (X̃_b, t, Y_b),
its own tests and decisions, and the Y_b it mixes are those of an agent whose samples were
corrupted that way. Its Laplace noise is drawn and added as an honest agent's would be (the
same draws as the run without adversaries); with ``skip_noise`` it starts from its raw mean
instead. ``inflate`` multiplies the neighbour-set size |C_b| it tells its kept neighbours (the
``size`` message, which eq. (2)'s W_ab = 1/(1 + max(|C_a|, |C_b|)) and the fallback read) by
``factor``; its values stay honest. It never touches another agent's data or sends.

**Robust consensus** (`consensus`, Yin et al. 2018, docs/papers.md §6). Instead of the weighted
mix (W Y)_a, an agent combines its own Y_a and the Y_b of the neighbours it mixes by their
median (``median``: the ⌊·⌋ middle of the 1 + |mixed| values, the mean of the two middle ones
when even), or by a trimmed mean (``trimmed``: of its n mixed neighbours the ⌊β·n⌋ lowest and
⌊β·n⌋ highest Y_b are dropped and the rest averaged with Y_a, its own value always kept, as
Private-ColME's trimmed combination keeps its own mean). The α schedule is unchanged:
Y_a ← (1 − α) X̃_a + α·v_a. When ⌊β·n⌋ (or, for the median, fewer than half the values) bounds
the adversaries an agent mixes, v_a lies between the smallest and the largest honest value it
holds, so no adversary can pull an honest agent outside the honest agents' range. The weights
W are not used (`mixing_matrix` still describes eq. (2)).

**B-ColME** (`TableAdversarial`, the same behaviours and aggregates): an adversary's own mean
X̃_b is corrupted as above, ``inflate`` multiplies the sample count n_b its tables tell, and
``combination = "median"`` or ``"trimmed"`` takes the aggregate over X̃_a and the kept
neighbours' depth-0 means instead of the tables' weighted mean (`desim.models.ccolme.bcolme`).
With ``forwarded = "corrupted"`` an adversary also corrupts the sums S^(k) it forwards, as its
behaviour would have every agent in them report its mean: a sum of c^(k) means becomes
S^(k) + s·c^(k) (shift), 2μ̄·c^(k) − S^(k) (flip: every mean reflected around μ̄) or
centre·c^(k) (mimic, collude: every mean at μ_c + s or the target, the deviations a sum
hides taken at 0), the counts c^(k) unchanged (docs/adversaries.md says why).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from desim.models.adversaries import STREAM, ActiveAdversaries, Adversaries

#: The [adversaries] behaviours meaningful for C-ColME and Private-C-ColME (a state carries a
#: mean, the ``size`` message a count that eq. (2) weighs by).
ADVERSARY_BEHAVIOURS = ("shift", "flip", "mimic", "collude", "inflate")
#: The consensus steps: eq. (2)'s weighted mix, or a robust aggregate.
CONSENSUS = ("weighted", "median", "trimmed")


def check_params(params: Any, family: str, key: str = "consensus", forwards: bool = False) -> None:
    """Check the ``adversaries``, `key` (C-ColME's ``consensus``, B-ColME's ``combination``) and
    ``trim`` fields, keeping the table as a (hashable) `Adversaries` (``forwarded`` read where
    the messages forward sums: `forwards`); ValueError with one line otherwise."""
    if params.adversaries is not None:
        table = Adversaries.from_table(params.adversaries, ADVERSARY_BEHAVIOURS, family, forwards)
        object.__setattr__(params, "adversaries", table)
    how = getattr(params, key)
    if (how == "trimmed") != (params.trim is not None):
        raise ValueError(
            f"trim = {params.trim!r}: {key} = 'trimmed' needs trim (β in [0, 0.5)) "
            f"and reads it alone ({key} = {how!r})"
        )


def check_table_params(params: Any) -> None:
    """`check_params` for B-ColME (``combination``), and refuse a deflating ``inflate``: a
    receiver weighs b's depth-k entries by n_b − k, which a told n_b below the true one can
    make negative; and ``inflate`` with corrupted forwarded sums: it corrupts no value."""
    check_params(params, "B-ColME and Private-B-ColME", "combination", forwards=True)
    spec = params.adversaries
    if spec is not None and spec.factor is not None and spec.factor < 1:
        raise ValueError(
            f"adversaries.factor = {spec.factor!r}: B-ColME needs factor ≥ 1 (its receivers "
            f"weigh depth k by factor·n_b − k, negative for a deflated n_b)"
        )
    if spec is not None and spec.behaviour == "inflate" and spec.forwarded == "corrupted":
        raise ValueError(
            "adversaries.forwarded = 'corrupted': behaviour = 'inflate' reports no value to "
            "corrupt (its told n_b already weighs every entry it forwards); use 'unchanged'"
        )


class GraphAdversaries:
    """The adversaries of one C-ColME run: their corrupted means and the sizes they tell."""

    def __init__(self, active: ActiveAdversaries) -> None:
        """Wrap the run's `ActiveAdversaries` (mask, behaviour's affine map)."""
        self.active = active
        #: Per agent the factor on the |C_b| it tells (``inflate``), else None.
        self.told = (
            np.where(active.mask, active.spec.factor, 1.0)
            if active.spec.behaviour == "inflate"
            else None
        )
        bad = active.ids
        #: Whether the behaviour changes the adversaries' means (there are some, not inflate).
        self.corrupts = active.corrupts_values and len(bad) > 0
        # the adversaries' rows of the affine map, gathered once (`mean` runs every slot); a
        # sign of 1 is left out: 1·x is x, bit for bit
        sign = active.sign[bad]
        self._sign = None if np.all(sign == 1.0) else sign
        self._add = active.add[bad]
        self._skip = active.spec.skip_noise
        #: Whether they corrupt the sums they forward too (B-ColME, ``forwarded``).
        self.corrupts_forwarded = self.corrupts and active.spec.forwarded == "corrupted"
        # (the senders' array of the last `forwarded` call, the columns adversaries send)
        self._columns: tuple[np.ndarray | None, np.ndarray] = (None, np.empty(0, np.int64))

    @classmethod
    def build(cls, params: Any, ctx: Any) -> GraphAdversaries | None:
        """The run's adversaries from `params.adversaries` (None without the table), drawn from
        the ``adversaries`` stream."""
        spec = params.adversaries
        if spec is None:
            return None
        return cls(ActiveAdversaries.build(spec, ctx.adversary_truth, ctx.streams.get(STREAM)))

    def mean(self, mean: np.ndarray, raw_sum: np.ndarray | None, t: int) -> np.ndarray:
        """X̃ with the adversaries' rows as their behaviour reports them (from the raw running
        mean under ``skip_noise``): what every state and test of slot t derives from. The rows
        are written into `mean`, which the caller made fresh for the slot (X̃ = Σ/t)."""
        if not self.corrupts:
            return mean
        bad = self.active.ids
        start = raw_sum.take(bad) / t if self._skip else mean.take(bad)  # type: ignore[union-attr]
        # `ActiveAdversaries.report` on the adversaries' rows: sign_b · x + add_b
        if self._sign is not None:
            start *= self._sign
        start += self._add
        mean.put(bad, start)
        return mean

    def forwarded(self, senders: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> None:
        """Corrupt, in place, the sums of means (`sums`, one row per depth, one column per
        message, `counts` the means in each) that `senders` forward: in an adversary b's
        columns, centre·c (mimic, collude) or sign_b·S + add_b·c (shift, flip), the
        behaviour's report of every mean in the sum."""
        if self._columns[0] is not senders:  # the same edges until the graph changes
            self._columns = (senders, np.flatnonzero(self.active.mask[senders]))
        cols = self._columns[1]
        if len(cols) == 0:
            return
        if self.active.centre is not None:  # every mean at the centre, whoever's it was
            sums[:, cols] = self.active.centre * counts[:, cols]
            return
        b = senders[cols]
        out = sums[:, cols]
        if self._sign is not None:
            out *= self.active.sign[b]
        out += self.active.add[b] * counts[:, cols]
        sums[:, cols] = out


class Adversarial:
    """The hooks of a C-ColME protocol with ``adversaries`` and ``consensus`` fields (a mixin):
    set-up, what its states derive from, the sizes told, the consensus step's mix, the metric."""

    #: ``consensus = "weighted"`` is the step from before the field existed (config hashes).
    legacy_values: ClassVar[dict[str, Any]] = {"consensus": "weighted"}
    #: The run's adversaries (None: none).
    adversaries: GraphAdversaries | None = None
    #: The robust consensus step (None: eq. (2)'s weighted mix).
    robust: RobustConsensus | None = None

    def setup_robustness(self, ctx: Any) -> None:
        """Draw the run's adversaries and choose the consensus step, once."""
        self.adversaries = GraphAdversaries.build(self.params, ctx)
        self.robust = RobustConsensus.of(self.params)

    @property
    def told(self) -> np.ndarray | None:
        """Per agent the factor on the |C_b| it tells (None: every agent tells its own)."""
        return None if self.adversaries is None else self.adversaries.told

    def shared_mean(self, t: int) -> np.ndarray:
        """X̃^(t) = Σ_s (X + Z)/t, the adversaries' rows as they report them: what every state
        and test of slot t derives from."""
        mean = self.priv_sum / t
        return mean if self.adversaries is None else self.adversaries.mean(mean, self.raw_sum, t)

    @classmethod
    def check_setup(cls, params: Any, data: Any, links: Any) -> None:
        """Refuse adversaries that are not agents of this population."""
        if params.adversaries is not None:
            params.adversaries.check(data.n_agents, data.classes)

    @property
    def has_adversaries(self) -> bool:
        """Whether the run has an [adversaries] table (`Context.adversary_truth` is then set)."""
        return self.params.adversaries is not None

    def adversary_state(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(which agents are adversaries, how many adversaries each agent keeps in C_a), for the
        `adversaries` metric; None without an [adversaries] table."""
        if self.adversaries is None:
            return None
        mask = self.adversaries.active.mask
        kept = self.kept & mask[self.dst]
        return mask, np.bincount(self.src[kept], minlength=len(mask))


class TableAdversarial(Adversarial):
    """The hooks of B-ColME with ``adversaries`` and ``combination`` fields (a mixin): set-up,
    the mean its tables carry, the robust combination, the metric; `told` (per agent, not per
    edge, so a changed graph needs nothing) is the factor on the sample count each one tells."""

    #: ``combination = "weighted"`` is §2.6's estimate, from before the field existed.
    legacy_values: ClassVar[dict[str, Any]] = {"combination": "weighted"}
    #: Σ X_a without noise, kept only for ``skip_noise`` adversaries (None otherwise).
    raw_sum: np.ndarray | None = None

    def setup_robustness(self, ctx: Any) -> None:
        """Draw the run's adversaries and choose the combination, once."""
        self.adversaries = GraphAdversaries.build(self.params, ctx)
        self.robust = RobustConsensus.of(self.params, "combination")
        if self.adversaries is not None and self.adversaries.active.spec.skip_noise:
            self.raw_sum = np.zeros(ctx.n_agents)

    def own_mean(self, t: int, samples: np.ndarray) -> np.ndarray:
        """X̃^(t) after slot t's `samples` (their noise already in `priv_sum`), the adversaries'
        rows as they report them: what its tables, tests and estimate derive from."""
        if self.raw_sum is not None:
            self.raw_sum += samples
        return self.shared_mean(t)

    def corrupt_forwarded(self, sums: np.ndarray, counts: np.ndarray) -> None:
        """The sums S^(k) this slot's tables forward (`sums`, one column per message, sent by
        `dst`), corrupted in place where adversaries corrupt forwarded sums."""
        if self.adversaries is not None and self.adversaries.corrupts_forwarded:
            self.adversaries.forwarded(self.dst, sums, counts)

    def robust_estimate(self) -> np.ndarray | None:
        """Yin et al.'s median or trimmed mean of X̃_a and the depth-0 means X̃_b of a's kept
        neighbours heard from (None: §2.6's sample-weighted combination of the tables)."""
        if self.robust is None:
            return None
        e = np.flatnonzero(self.kept & (self.held[1] > 0))  # CSR order: grouped by a
        counts = np.bincount(self.src[e], minlength=len(self.mean))
        return self.robust.mix(self.mean, self.held[0, e], counts)


class RobustConsensus:
    """The consensus step's robust aggregate over an agent's own Y_a and its mixed Y_b."""

    def __init__(self, how: str, trim: float | None) -> None:
        """`how`: ``median`` or ``trimmed`` (with `trim` = β)."""
        self.how, self.trim = how, trim

    @classmethod
    def of(cls, params: Any, key: str = "consensus") -> RobustConsensus | None:
        """The strategy of `params.consensus` (or of B-ColME's `params.combination`: `key`;
        None: the weighted mix or combination)."""
        how = getattr(params, key)
        if how == "weighted":
            return None
        return cls(how, params.trim)

    def mix(self, y: np.ndarray, nb_y: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """v_a for every agent a from Y_a (`y`) and the Y_b of its `counts[a]` mixed neighbours,
        consecutive in `nb_y` (CSR order), a new array."""
        m = len(y)
        width = int(counts.max()) if m and len(nb_y) else 0
        if width == 0:
            return y.copy()
        owner = np.repeat(np.arange(m), counts)
        column = np.arange(len(nb_y)) - (np.cumsum(counts) - counts)[owner]
        if self.how == "median":  # own value in column 0, padding +∞ (sorted last)
            table = np.full((m, width + 1), np.inf)
            table[:, 0] = y
            table[owner, column + 1] = nb_y
            table.sort(axis=1)
            rows = np.arange(m)
            return (table[rows, counts // 2] + table[rows, (counts + 1) // 2]) / 2.0
        # the families stay apart, so this is Private-ColME's trim (`trimmed_sums`) with equal
        # weights, written again: ranks in each row by value (stable), padding +∞ ranked last
        value = np.full((m, width), np.inf)
        value[owner, column] = nb_y
        order = np.argsort(value, axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(width)[None, :], axis=1)
        cut = np.floor(self.trim * counts).astype(np.int64)  # type: ignore[operator]
        kept = (rank >= cut[:, None]) & (rank < (counts - cut)[:, None])
        sums = np.where(kept, value, 0.0).sum(axis=1)
        return (y + sums) / (1.0 + kept.sum(axis=1))
