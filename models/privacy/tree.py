"""How many released nodes of PM-II's binary tree hold one sample, and the calibration for it.

PM-II (seed 002 §IV-B) builds agent b's release κ to querier a from the PM-I split of [1:t_κ]
into κ leaves (leaf i: b's samples since its release i−1 to a), joined into dyadic nodes by the
binary representation of κ: release κ completes exactly one new node, at the lowest set bit of
κ, covering leaves (κ − 2^s, κ]; every other node it uses was released before
(`desim.models.privacy.release.PSumRelease`). After κ releases to a, leaf i therefore lies in
the released nodes of the levels s with ⌈i/2^s⌉·2^s ≤ κ. Leaf 1 (which holds b's first sample)
lies in one per level s with 2^s ≤ κ — ⌊log₂ κ⌋+1 of them — and no leaf in more, since
⌈i/2^s⌉·2^s ≥ 2^s. A sample's exposure to one querier is thus set by the number of releases
that querier gets by the horizon, κ_max, not by the horizon t_max itself: under round robin,
M − 1 queriers share the slots and κ_max = ⌈t_max/(M − 1)⌉.

`calibration = "tight"` composes ⌊log₂ t_max⌋+1 releases (the tree's level count for one
release per slot, which the committed studies use); ``"tight-tree"`` composes the
⌊log₂ κ_max⌋+1 nodes the tree really releases to one querier up to the horizon.
"""

from __future__ import annotations

from desim.models.privacy.accounting import CALIBRATIONS, psum_noise

#: Every calibration name of the p-sum mechanisms ("tight-tree" is this module's).
PSUM_CALIBRATIONS: tuple[str, ...] = (*CALIBRATIONS, "tight-tree")


def nodes_per_sample(releases: int) -> int:
    """The most released PM-II tree nodes any one sample lies in after `releases` releases to
    one querier: ⌊log₂ κ⌋+1 (0 before the first release)."""
    if isinstance(releases, bool) or int(releases) != releases or releases < 0:
        raise ValueError(f"releases = {releases!r}: must be an integer ≥ 0")
    return int(releases).bit_length()


def calibrated_psum_noise(
    noise: str,
    L: float,
    mechanism: str,
    epsilon: float,
    delta: float,
    t_max: int,
    calibration: str,
    releases: int,
    variance_release: bool = False,
    accountant: str = "pld",
) -> tuple[float, float]:
    """(σ_DP², σ_{2,DP}²) of Private-ColME's p-sums for any calibration name.

    "paper" and "tight" are `psum_noise` at the horizon `t_max`; "tight-tree" is the tight
    calibration for the `releases` (κ_max) releases one querier gets by the horizon, whose tree
    holds a sample in ⌊log₂ κ_max⌋+1 released nodes (`nodes_per_sample`) — `psum_noise`'s
    count for t_max = κ_max. PM-I's p-sums hold a sample once whatever κ_max. `accountant`
    ("pld" or "rdp") is the one the tight calibrations ask.
    """
    if calibration not in PSUM_CALIBRATIONS:
        raise ValueError(
            f"calibration = {calibration!r}: must be one of {', '.join(PSUM_CALIBRATIONS)}"
        )
    if calibration != "tight-tree":
        return psum_noise(
            noise, L, mechanism, epsilon, delta, t_max, calibration, variance_release, accountant
        )
    nodes_per_sample(releases)  # validates κ_max
    # psum_noise's count for a horizon h is ⌊log₂ h⌋+1 = nodes_per_sample(h); no release at all
    # (κ_max = 0) is calibrated as one
    horizon = max(1, int(releases))
    return psum_noise(
        noise, L, mechanism, epsilon, delta, horizon, "tight", variance_release, accountant
    )
