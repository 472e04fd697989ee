"""Adversarial agents (a study's ``[adversaries]`` table): who they are, what their messages carry.

An adversary runs the protocol's code except for what its messages carry: its releases (Private-
ColME) or uploads (the empirical-Bayes server protocols). It never touches another agent's data,
the links or the honest agents' rules, and its privacy noise is still added unless the table says
``skip_noise = true`` (the mechanism is the sender's own code, which by default the adversary
does not replace: the same noise draws as the honest run, so the comparison isolates what the
adversary reports). Adversaries are omniscient about the truth at the start of a run (every
agent's mean and class), as the strongest mimic or flip would be.

Behaviours, each a map of the value an honest agent would report (its running mean, before
noise) to the value the adversary reports:

- ``shift``: + `shift`, as if its samples were shifted by it;
- ``flip``: reflected around the population mean μ̄ (2μ̄ − x), as if its samples were;
- ``mimic``: as if its mean were class `class`'s plus `shift` (default 0): + μ_c + shift − μ_b,
  so that class tests accept it there while it pulls that class by `shift`;
- ``collude``: every adversary as if its mean were `target` (+ target − μ_b);
- ``inflate``: its count (sample size) multiplied by `factor`, where a receiver weighs by counts.

What an adversary does to the values of other agents it forwards (``forwarded``): B-ColME's
tables alone carry such sums, and its adversaries forward them ``unchanged`` (the default) or
``corrupted``, the behaviour applied to every mean in them (`desim.models.ccolme.robust`).

Who is an adversary: the `agents` listed, or round(fraction · M) agents drawn from the run's
``adversaries`` stream (a common-random-number stream: every protocol of a study, and every
fraction, draws from the same permutation, so the adversaries at fraction f are among those at
any larger f). No other stream draws differently, so the honest agents' data are those of the
run without adversaries.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The behaviours and the parameters each one reads.
BEHAVIOURS: dict[str, tuple[str, ...]] = {
    "shift": ("shift",),
    "flip": (),
    "mimic": ("class",),
    "collude": ("target",),
    "inflate": ("factor",),
}
#: Parameters a behaviour may leave out (their default: 0).
OPTIONAL: dict[str, tuple[str, ...]] = {"mimic": ("shift",)}
#: Every key an [adversaries] table may hold.
KEYS = (
    "fraction",
    "agents",
    "behaviour",
    "skip_noise",
    "shift",
    "class",
    "target",
    "factor",
    "forwarded",
)
#: What an adversary does to the sums of other agents' values it forwards (B-ColME's tables).
FORWARDED = ("unchanged", "corrupted")
#: Why a family refuses ``forwarded``, where more than "nothing to forward" (by family name).
NOT_FORWARDED = {
    "pricer": "its adversaries always corrupt the honest shares they relay",
    "C-ColME and Private-C-ColME": "a state's Y_b is the sender's own consensus estimate, "
    "derived from its corrupted mean",
}
#: The random stream the adversaries are drawn from (`desim.kernel.randomness.Streams.SHARED`).
STREAM = "adversaries"


def _number(key: str, value: Any) -> float:
    """`value` as a finite float, else ValueError naming adversaries.`key`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"adversaries.{key} = {value!r}: must be a finite number")
    return float(value)


@dataclass(frozen=True)
class Adversaries:
    """A validated [adversaries] table: who the adversaries are and how they behave."""

    behaviour: str
    fraction: float | None = None
    agents: tuple[int, ...] | None = None
    skip_noise: bool = False
    shift: float | None = None
    mimic_class: int | None = None
    target: float | None = None
    factor: float | None = None
    forwarded: str = "unchanged"

    @classmethod
    def from_table(
        cls, table: Any, allowed: tuple[str, ...], family: str, forwards: bool = False
    ) -> Adversaries:
        """The adversaries of a study's ``adversaries = {…}`` table for a protocol `family` whose
        meaningful behaviours are `allowed` and whose messages carry sums of other agents'
        values (`forwards`: then ``forwarded`` is read); ValueError with one line naming the
        key, its value and what is allowed."""
        if isinstance(table, Adversaries):
            return table
        if not isinstance(table, dict):
            raise ValueError(
                f"adversaries = {table!r}: must be a table {{fraction = …, behaviour = …}}"
            )
        for key in table:
            if key not in KEYS:
                close = difflib.get_close_matches(str(key), KEYS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"adversaries.{key}: unknown key{hint}; allowed: {', '.join(KEYS)}"
                )
        behaviour = table.get("behaviour")
        if behaviour not in BEHAVIOURS:
            raise ValueError(
                f"adversaries.behaviour = {behaviour!r}: must be one of {', '.join(BEHAVIOURS)}"
            )
        if behaviour not in allowed:
            raise ValueError(
                f"adversaries.behaviour = {behaviour!r}: not meaningful for {family} "
                f"(allowed: {', '.join(allowed)})"
            )
        needs = BEHAVIOURS[behaviour]
        reads = needs + OPTIONAL.get(behaviour, ())
        for key in ("shift", "class", "target", "factor"):
            if key in needs and key not in table:
                raise ValueError(f"adversaries: behaviour = {behaviour!r} needs {key}")
            if key not in reads and key in table:
                only = f"reads only {', '.join(reads)}" if reads else "reads no parameter"
                raise ValueError(
                    f"adversaries.{key} = {table[key]!r}: behaviour = {behaviour!r} {only}; "
                    f"remove {key}"
                )
        skip = table.get("skip_noise", False)
        if not isinstance(skip, bool):
            raise ValueError(f"adversaries.skip_noise = {skip!r}: must be true or false")
        extra = _behaviour_params(table)
        if "forwarded" in table:
            extra["forwarded"] = _forwarded(table["forwarded"], family, forwards)
        return cls(behaviour, *_who(table), skip, **extra)

    def check(self, n_agents: int, classes: np.ndarray) -> None:
        """ValueError (one line) for ids that are not agents of a population of `n_agents`, or
        a mimicked class no agent of `classes` is in."""
        if self.agents is not None and self.agents and max(self.agents) >= n_agents:
            bad = max(self.agents)
            raise ValueError(f"adversaries.agents: {bad} is not an agent (ids: 0 … {n_agents - 1})")
        if self.agents is not None and len(self.agents) >= n_agents:
            raise ValueError(
                f"adversaries.agents: {len(self.agents)} ids name every agent "
                f"(at least one must be honest)"
            )
        if self.mimic_class is not None and not np.any(classes == self.mimic_class):
            raise ValueError(
                f"adversaries.class = {self.mimic_class}: no agent is in that class "
                f"(classes: {', '.join(map(str, np.unique(classes)))})"
            )

    def draw(self, n_agents: int, rng: np.random.Generator) -> np.ndarray:
        """Which agents are adversaries (a bool mask), the listed ones or round(fraction · M) of
        a permutation drawn from `rng` (the ``adversaries`` stream)."""
        mask = np.zeros(n_agents, dtype=bool)
        if self.agents is not None:
            mask[list(self.agents)] = True
        else:
            mask[rng.permutation(n_agents)[: round(self.fraction * n_agents)]] = True
        return mask


def _who(table: dict) -> tuple[float | None, tuple[int, ...] | None]:
    """(fraction, agents) of a table that gives exactly one of them, checked."""
    if ("fraction" in table) == ("agents" in table):
        raise ValueError("adversaries: give either fraction (a share in [0, 1)) or agents (ids)")
    if "fraction" in table:
        f = _number("fraction", table["fraction"])
        if not 0 <= f < 1:
            raise ValueError(f"adversaries.fraction = {f!r}: must lie in [0, 1)")
        return f, None
    ids = table["agents"]
    ok = isinstance(ids, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    )
    if not ok or len(set(ids)) != len(ids):
        raise ValueError(f"adversaries.agents = {ids!r}: must be a list of distinct agent ids ≥ 0")
    return None, tuple(sorted(ids))


def _forwarded(value: Any, family: str, forwards: bool) -> str:
    """The ``forwarded`` value of a family that forwards sums (`forwards`), checked."""
    if value not in FORWARDED:
        raise ValueError(
            f"adversaries.forwarded = {value!r}: must be one of {', '.join(FORWARDED)}"
        )
    if not forwards:
        why = NOT_FORWARDED.get(family, "its messages carry no sums of other agents' values")
        raise ValueError(
            f"adversaries.forwarded = {value!r}: only B-ColME's tables forward such sums, not "
            f"{family} ({why}); remove forwarded"
        )
    return value


def _behaviour_params(table: dict) -> dict[str, Any]:
    """The behaviour's own parameters, checked (which ones it reads is checked by the caller)."""
    out: dict[str, Any] = {}
    if "shift" in table:
        out["shift"] = _number("shift", table["shift"])
    if "target" in table:
        out["target"] = _number("target", table["target"])
    if "factor" in table:
        factor = _number("factor", table["factor"])
        if factor <= 0:
            raise ValueError(f"adversaries.factor = {factor!r}: must be > 0")
        out["factor"] = factor
    if "class" in table:
        c = table["class"]
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ValueError(f"adversaries.class = {c!r}: must be a class index ≥ 0")
        out["mimic_class"] = c
    return out


class ActiveAdversaries:
    """The adversaries of one run: their mask and the affine map of what they report.

    An adversary b reports sign_b · x + add_b for the value x an honest b would report (sign
    −1 under flip, else 1); honest agents' rows are left as they are.
    """

    def __init__(self, spec: Adversaries, mask: np.ndarray, means: np.ndarray, classes: Any):
        self.spec = spec
        #: Whether each agent is an adversary, and the adversaries' ids.
        self.mask = mask
        self.ids = np.flatnonzero(mask)
        self.sign = np.ones(len(mask))
        self.add = np.zeros(len(mask))
        #: mimic and collude: the mean every adversary reports as its own (μ_c + shift, or the
        #: target), before its sampling deviation; None for the other behaviours.
        self.centre: float | None = None
        b = self.ids
        if spec.behaviour == "shift":
            self.add[b] = spec.shift
        elif spec.behaviour == "flip":
            self.sign[b] = -1.0
            self.add[b] = 2.0 * float(np.mean(means))
        elif spec.behaviour == "mimic":
            centre = float(np.mean(means[classes == spec.mimic_class])) + (spec.shift or 0.0)
            self.add[b] = centre - means[b]
            self.centre = centre
        elif spec.behaviour == "collude":
            self.add[b] = spec.target - means[b]
            self.centre = spec.target

    @classmethod
    def build(cls, spec: Adversaries | None, truth: Any, rng: Any) -> ActiveAdversaries | None:
        """The run's adversaries from the validated table `spec` (None: no table), the data
        source `truth` (its means and classes at the start) and the ``adversaries`` stream."""
        if spec is None:
            return None
        mask = spec.draw(truth.n_agents, rng)
        return cls(spec, mask, np.asarray(truth.means, dtype=float), np.asarray(truth.classes))

    @property
    def corrupts_values(self) -> bool:
        """Whether the behaviour changes reported values (all but inflate)."""
        return self.spec.behaviour != "inflate"

    def report(self, who: np.ndarray, values: np.ndarray, honest: np.ndarray | None) -> np.ndarray:
        """What agents `who` report instead of `values` (the honest reports, noise included);
        with ``skip_noise`` an adversary starts from `honest` (the noiseless value) instead."""
        bad = self.mask[who]
        if not bad.any() or not self.corrupts_values:
            return values
        out = values.copy()
        start = honest[bad] if self.spec.skip_noise and honest is not None else values[bad]
        out[bad] = self.sign[who[bad]] * start + self.add[who[bad]]
        return out

    def counts(self, who: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The counts agents `who` report instead of `counts` (inflated by the adversaries)."""
        if self.spec.behaviour != "inflate":
            return counts
        return np.where(self.mask[who], counts * self.spec.factor, counts)


def coordinatewise_location(rows: np.ndarray, how: str, trim: float | None = None) -> np.ndarray:
    """The coordinate-wise median (``median``) or trimmed mean (``trimmed``: the ⌊β·m⌋ lowest
    and highest values of each coordinate of the m vectors `rows` dropped, β = `trim`) of Yin
    et al. (2018): robust aggregates of vectors a minority of which may be corrupted."""
    rows = np.asarray(rows, dtype=float)
    if how == "median":
        return np.median(rows, axis=0)
    m = len(rows)
    cut = int(np.floor(trim * m))
    return np.sort(rows, axis=0)[cut : m - cut].mean(axis=0)


def honest_mse(estimates: np.ndarray, means: np.ndarray, mask: np.ndarray) -> float:
    """The mean squared error over the honest agents (those `mask` does not mark)."""
    err2 = (np.asarray(estimates, dtype=float) - means) ** 2
    if err2.ndim > 1:  # vector estimates: squared Euclidean error per agent
        err2 = err2.sum(axis=tuple(range(1, err2.ndim)))
    return float(err2[~mask].mean())


class VectorAdversaries(ActiveAdversaries):
    """The adversaries of a run on vector data (PriCER, `desim.models.pricer.data`): what the
    shares they send and the relays they forward carry.

    Adversary b sends its shares and its own relay term with the vector x'_b = sign_b x_b +
    add_b in place of x_b: shift x_b + s·1, flip 2x̄ − x_b (x̄ the nodes' mean vector),
    collude target·1. Every share from an honest node i that b relays carries instead what
    it would carry had i been such an adversary: α_ib x'_i plus the noise it came with
    (negated under flip); shares from other adversaries are relayed as they came.
    """

    def __init__(self, spec: Adversaries, mask: np.ndarray, x: np.ndarray) -> None:
        self.spec = spec
        self.mask = mask
        self.ids = np.flatnonzero(mask)
        self.sign = np.ones(len(mask))
        #: add_b, one row of d coordinates per node (zero for honest nodes).
        self.add = np.zeros(x.shape)
        self._x = x
        b = self.ids
        if spec.behaviour == "shift":
            self.add[b] = spec.shift
        elif spec.behaviour == "flip":
            self.sign[b] = -1.0
            self.add[b] = 2.0 * x.mean(axis=0)
        elif spec.behaviour == "collude":
            self.add[b] = spec.target - x[b]

    @classmethod
    def build(cls, spec: Adversaries | None, truth: Any, rng: Any) -> VectorAdversaries | None:
        """The run's adversaries from the validated table `spec` (None: no table), the vector
        data `truth` (its x_i) and the ``adversaries`` stream."""
        if spec is None:
            return None
        mask = spec.draw(truth.n_agents, rng)
        return cls(spec, mask, np.asarray(truth.x, dtype=float))

    def vectors(self, x: np.ndarray) -> np.ndarray:
        """The vectors the nodes send shares of: x'_b for the adversaries, x_i for the others."""
        out = np.array(x, dtype=float)
        b = self.ids
        out[b] = self.sign[b, None] * x[b] + self.add[b]
        return out

    def own_noise(self, who: np.ndarray, noise: np.ndarray | float) -> np.ndarray | float:
        """The noise of messages sent by `who`: without the adversaries' under ``skip_noise``."""
        if not self.spec.skip_noise or np.isscalar(noise):
            return noise
        return noise * ~self.mask[who, None]

    def relayed(
        self, src: np.ndarray, dst: np.ndarray, alpha: np.ndarray, rows: np.ndarray
    ) -> np.ndarray:
        """The shares `rows` (α_ij x_i + n_ij from `src` i to `dst` j, `alpha` = α_ij as a
        column) as their receivers forward them: corrupted where j is an adversary and i not."""
        bad = self.mask[dst] & ~self.mask[src]
        if not bad.any():
            return rows
        out = rows.copy()
        i, j = src[bad], dst[bad]
        if self.spec.behaviour == "collude":
            add = self.spec.target - self._x[i]  # as if x_i were the target
        else:
            add = self.add[j]  # shift: + s·1; flip: 2x̄ (with the row negated)
        out[bad] = self.sign[j, None] * rows[bad] + alpha[bad] * add
        return out
