"""Numbers for a study's README: a metric at one slot, and the time each run takes to reach a
target (e.g. the first slot at which the MSE falls to 10⁻³).

The recorder measures at checkpoints only, so the time to target is interpolated between the
last checkpoint above the target and the first one at or below it, linearly in (log t, log
value) — the scale on which error curves are straight. A run that never reaches the target has
no time (NaN); the summary reports how many replicates reached it and the median over all of
them (unreached runs count as later than every reached one, so the median is finite only when
more than half reached).

After a disturbance at slot τ (a class switch, an outage), `time_to_recover` gives each run's
time from τ until the metric is back within a factor of its value just before τ (the last
checkpoint before τ), interpolated the same way.

With per-agent results (`per_agent = true`) and the privacy ledger, the summary also gives the
spread of the ε spent over agents: the 5, 50 and 95 % quantiles of every agent's ε at the slot
(`agent_quantiles`), the agents of all replicates pooled.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from desim.study.spec.model import LEDGER_PREFIX

#: The quantiles over agents of the per-agent ε that `summarise_runs` reports.
QUANTILES = (0.05, 0.5, 0.95)


def first_crossing(t: np.ndarray, value: np.ndarray, target: float) -> float:
    """The slot at which a curve measured at checkpoints `t` first reaches `value` ≤ target.

    Log–log interpolation between the checkpoints around the crossing; the first checkpoint
    when it is already at or below the target; NaN when the curve never gets there.
    """
    below = np.flatnonzero(value <= target)
    if len(below) == 0:
        return float("nan")
    i = int(below[0])
    if i == 0:
        return float(t[0])
    v0, v1 = value[i - 1], value[i]
    if v1 <= 0 or v0 <= 0 or target <= 0:  # log scale undefined: take the checkpoint
        return float(t[i])
    frac = (np.log(v0) - np.log(target)) / (np.log(v0) - np.log(v1))
    return float(np.exp(np.log(t[i - 1]) + frac * (np.log(t[i]) - np.log(t[i - 1]))))


def time_to_target(
    metrics: pd.DataFrame, target: float, metric: str = "mse", grid: list[str] | None = None
) -> pd.DataFrame:
    """Per grid point, scenario and replicate: the slot `metric` first reaches `target`."""
    keys = [*(grid or []), "scenario", "replicate"]
    rows = metrics[metrics["metric"] == metric].sort_values([*keys, "t"])
    out = []
    for key, run in rows.groupby(keys, sort=False):
        hit = first_crossing(run["t"].to_numpy(float), run["value"].to_numpy(float), target)
        out.append((*(key if isinstance(key, tuple) else (key,)), hit))
    return pd.DataFrame(out, columns=[*keys, "t_target"])


def time_to_recover(
    metrics: pd.DataFrame,
    after: float,
    within: float = 2.0,
    metric: str = "mse",
    grid: list[str] | None = None,
) -> pd.DataFrame:
    """Per grid point, scenario and replicate: `metric` at the last checkpoint before slot
    `after` (``before``) and the slots from `after` until it is back at or below `within` times
    that value (``t_recover``; NaN if it never is, or if no checkpoint precedes `after`)."""
    keys = [*(grid or []), "scenario", "replicate"]
    rows = metrics[metrics["metric"] == metric].sort_values([*keys, "t"])
    out = []
    for key, run in rows.groupby(keys, sort=False):
        t, value = run["t"].to_numpy(float), run["value"].to_numpy(float)
        pre = np.flatnonzero(t < after)
        before = float(value[pre[-1]]) if len(pre) else float("nan")
        post = t >= after
        hit = first_crossing(t[post], value[post], within * before) if len(pre) else np.nan
        out.append((*(key if isinstance(key, tuple) else (key,)), before, hit - after))
    return pd.DataFrame(out, columns=[*keys, "before", "t_recover"])


def _median_time(times: pd.DataFrame, column: str, count: str, keys: list[str]) -> pd.DataFrame:
    """How many replicates have a time in `column` (as `count`), and the median over all of
    them (``<column>_median``; those without a time count as later than every other, so the
    median is finite only when more than half have one)."""
    late = times[column].fillna(np.inf)
    per = times.assign(**{column: late}).groupby(keys, sort=False)[column]
    return pd.DataFrame(
        {
            count: per.apply(lambda s: int(np.isfinite(s).sum())),
            f"{column}_median": per.median().replace(np.inf, np.nan),
        }
    )


def summarise_runs(
    metrics: pd.DataFrame,
    metric: str = "mse",
    grid: list[str] | None = None,
    at: float | None = None,
    target: float | None = None,
    beside: list[str] | None = None,
    agents: pd.DataFrame | None = None,
    recover: tuple[float, float] | None = None,
) -> pd.DataFrame:
    """One row per grid point and scenario: `metric` at slot `at` (default: each run's last
    checkpoint) as its mean over replicates (``value``) and standard error (``stderr``), and,
    with a target, how many replicates reached it and their median time to it; a column with
    the mean of each metric `beside` at the same slot (e.g. the privacy ledger's ε spent); with
    the per-agent table `agents`, the quantiles over agents of each per-agent ε at that slot
    (`agent_quantiles`); with `recover` = (τ, factor), the mean value before τ and the median
    time to recover within that factor of it (`time_to_recover`)."""
    grid = list(grid or [])
    keys = [*grid, "scenario"]
    rows = metrics[metrics["metric"] == metric]
    if at is None:
        last = rows.groupby([*keys, "replicate"], sort=False)["t"].transform("max")
        rows = rows[rows["t"] == last]
    else:
        rows = rows[rows["t"] == at]
    # column names a grid column cannot take (results' reserved names), e.g. a swept "mean"
    stats = rows.groupby(keys, sort=False)["value"].agg(
        value="mean", value_std="std", replicates="count"
    )
    stats["stderr"] = stats["value_std"].fillna(0.0) / np.sqrt(stats["replicates"])
    out = stats[["value", "stderr", "replicates"]].copy()
    if target is not None:
        hits = time_to_target(metrics, target, metric, grid)
        out = out.join(_median_time(hits, "t_target", "reached", keys))
    if recover is not None:
        times = time_to_recover(metrics, *recover, metric, grid)
        out["before"] = times.groupby(keys, sort=False)["before"].mean()
        out = out.join(_median_time(times, "t_recover", "recovered", keys))
    for other in beside or []:  # e.g. the privacy spent, next to the MSE
        if other != metric:
            out[other] = summarise_runs(metrics, other, grid, at).set_index(keys)["value"]
    if agents is not None:
        spread = agent_quantiles(agents, grid, at).set_index(keys)
        for column in spread.columns:
            out[column] = spread[column]
    return out.reset_index()


def agent_ledger(agents: pd.DataFrame) -> list[str]:
    """The per-agent ε columns of a per-agent table (``eps_<who>``, after ``value``)."""
    if "value" not in agents.columns:
        return []
    after = list(agents.columns[list(agents.columns).index("value") + 1 :])
    return [c for c in after if c.startswith(LEDGER_PREFIX)]


def agent_quantiles(
    agents: pd.DataFrame, grid: list[str] | None = None, at: float | None = None
) -> pd.DataFrame:
    """Per grid point and scenario: the 5, 50 and 95 % quantiles over agents (those of every
    replicate pooled) of each per-agent ε at slot `at` (default: each run's last checkpoint,
    t_max), as columns ``eps_<who>_p5``, ``_p50``, ``_p95``; agents without a value (a protocol
    with no such recipient set) are left out."""
    keys = [*(grid or []), "scenario"]
    columns = agent_ledger(agents)
    if not columns or agents.empty:
        return pd.DataFrame(columns=keys)
    if at is None:
        last = agents.groupby([*keys, "replicate"], sort=False)["t"].transform("max")
        rows = agents[agents["t"] == last]
    else:
        rows = agents[agents["t"] == at]
    if rows.empty:
        return pd.DataFrame(columns=keys)
    groups = rows.groupby(keys, sort=False)
    table = {
        f"{column}_p{100 * q:g}": groups[column].quantile(q)
        for column in columns
        for q in QUANTILES
    }
    return pd.DataFrame(table).reset_index()


def ledger_maxima(metrics: pd.DataFrame) -> list[str]:
    """The privacy ledger's per-run maxima recorded in `metrics` (eps_…_max), sorted."""
    names = metrics["metric"].unique()
    return sorted(n for n in names if n.startswith(LEDGER_PREFIX) and n.endswith("_max"))
