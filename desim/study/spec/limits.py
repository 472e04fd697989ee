"""What a study costs: the horizon `--quick` runs with, and the size checks that refuse a study
too large for one machine before its grid is expanded."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from desim.kernel.params import ConfigError
from desim.study.spec.model import QUICK_FALLBACK
from desim.study.spec.parse import StudyDocument


@dataclass(frozen=True)
class Horizon:
    """Replicates, horizon, checkpoints and [data] table a study runs with (--quick changes
    them)."""

    replicates: int
    t_max: int
    checkpoints: int
    data: dict


def horizon(doc: StudyDocument, quick: bool) -> Horizon:
    """The study's horizon; with `quick`, the [quick] table (or `QUICK_FALLBACK`, never above
    the study's own values) overrides replicates, t_max, checkpoints and data.agents."""
    settings, data = doc.settings, dict(doc.data)
    if not quick:
        return Horizon(settings.replicates, settings.t_max, settings.checkpoints, data)
    q = {k: v for k, v in dataclasses.asdict(doc.quick).items() if v is not None}
    if "quick" not in doc.raw:
        q = {k: min(v, getattr(settings, k)) for k, v in QUICK_FALLBACK.items()}
    if "agents" in q:
        data["agents"] = q["agents"]
    return Horizon(
        q.get("replicates", settings.replicates),
        q.get("t_max", settings.t_max),
        q.get("checkpoints", settings.checkpoints),
        data,
    )


#: Largest study desim runs without --force: runs, agent-slots of one run, total agent-slots.
MAX_RUNS = 200_000
MAX_AGENT_SLOTS_PER_RUN = 10**11
MAX_AGENT_SLOTS = 10**13
MAX_CHECKPOINTS = 100_000
#: Bytes a run holds per agent and checkpoint (estimates, errors, per-agent records).
BYTES_PER_AGENT_CHECKPOINT = 64


def check_size(h: Horizon, grid: dict, n_scenarios: int) -> None:
    """Refuse a study too large to finish: run count, time and memory, estimated up front.

    A run costs about agents × t_max agent-slots of work and holds agents × checkpoints
    values; the estimate uses the largest agent count the grid reaches.
    """
    replicates, t_max, checkpoints, data = h.replicates, h.t_max, h.checkpoints, h.data
    points = math.prod(len(v) for v in grid.values() if isinstance(v, list))
    runs = points * max(n_scenarios, 1) * replicates
    if runs > MAX_RUNS:
        raise ConfigError(
            f"[study]: replicates = {replicates} × {points} grid points × "
            f"{n_scenarios} scenarios = {runs} runs: at most {MAX_RUNS} allowed "
            "(--force to run it anyway)"
        )
    if checkpoints > MAX_CHECKPOINTS:
        raise ConfigError(f"[study]: checkpoints = {checkpoints}: at most {MAX_CHECKPOINTS}")
    sizes = [data.get("agents")] + list(grid.get("data.agents", []))
    agents = max((a for a in sizes if isinstance(a, int) and not isinstance(a, bool)), default=1)
    per_run = agents * t_max
    if per_run > MAX_AGENT_SLOTS_PER_RUN:
        raise ConfigError(
            f"[study]: t_max = {t_max} with {agents} agents = {per_run:.3g} "
            f"agent-slots per run: at most {MAX_AGENT_SLOTS_PER_RUN:.0e} "
            "(--force to run it anyway)"
        )
    if per_run * runs > MAX_AGENT_SLOTS:
        raise ConfigError(
            f"[study]: {runs} runs of {per_run:.3g} agent-slots = "
            f"{per_run * runs:.3g}: at most {MAX_AGENT_SLOTS:.0e} in one study "
            "(--force to run it anyway)"
        )
    memory = agents * min(checkpoints, t_max) * BYTES_PER_AGENT_CHECKPOINT + agents * 4096
    available = _memory_bytes()
    if available and memory > available:
        raise ConfigError(
            f"[data]: agents = {agents}: one run needs about "
            f"{memory / 2**30:.3g} GiB; this machine has "
            f"{available / 2**30:.3g} GiB (--force to run it anyway)"
        )


def _memory_bytes() -> int | None:
    """Physical memory of this machine in bytes (None when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
