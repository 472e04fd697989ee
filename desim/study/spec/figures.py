"""The [[plot]] tables of a study checked (files, scenarios, curves, axes, metrics) and their
titles filled in: what validation makes of the figures, which never change results."""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from typing import Any

from desim.kernel.params import ConfigError, build
from desim.kernel.registry import METRICS, PROTOCOLS
from desim.study.spec.limits import Horizon
from desim.study.spec.model import (
    LEDGER_PREFIX,
    TITLE_FIELDS,
    PlotSpec,
    PlotTable,
    ScenarioSpec,
    default_scale,
    did_you_mean,
)
from desim.study.spec.parse import StudyDocument


def study_agents(data: dict) -> int | None:
    """The [data] agent count, when it is one number."""
    return data.get("agents") if isinstance(data.get("agents"), int) else None


#: The statistics over agents of the privacy ledger's per-run names (``eps_<who>_<stat>``).
LEDGER_STATS = ("mean", "max")


def agent_ledger_metric(metric: str) -> bool:
    """Whether `metric` names the privacy ledger's per-agent ε (``eps_<who>``, no statistic
    over agents after it), which a plot draws as its distribution over agents."""
    return metric.startswith(LEDGER_PREFIX) and metric.rpartition("_")[2] not in LEDGER_STATS


def check_agent_plots(plots: list[PlotSpec], per_agent: bool) -> None:
    """Refuse a plot of a per-agent ε (`agent_ledger_metric`) that cannot be drawn: without
    per-agent results, against another x than the slot, or with dashed metrics."""
    for plot in plots:
        if not agent_ledger_metric(plot.metric):
            continue
        where = f"plot {plot.file!r}: metric = {plot.metric!r}"
        if not per_agent:
            raise ConfigError(
                f"{where}: every agent's ε is kept only with [study] per_agent = true "
                f"(or plot {plot.metric}_max / {plot.metric}_mean)"
            )
        if plot.x != "t":
            raise ConfigError(f"{where}: the spread over agents is drawn against x = 't' only")
        if plot.dashed:
            raise ConfigError(f"{where}: dashed: not drawn beside the spread over agents")


def final_plots(
    plots: list[PlotSpec], scenarios: list[ScenarioSpec], doc: StudyDocument, h: Horizon
) -> list[PlotSpec]:
    """The plots with their titles filled in, each plotted metric checked to be recorded."""
    check_agent_plots(plots, doc.settings.per_agent)
    fields = _title_fields(doc, h)
    plots = [
        dataclasses.replace(q, title=_fill_title(q.title, fields, f"plot {q.file!r}"))
        for q in plots
    ]
    outputs = [
        getattr(METRICS.lookup(name, "study: metrics"), "outputs", None)
        for name in doc.settings.metrics
    ]
    if all(d is not None for d in outputs):  # a metric that declares nothing: not checkable
        _check_plot_metrics(plots, scenarios, [p for d in outputs for p in d])
    return plots


def study_title(doc: StudyDocument, h: Horizon) -> str:
    """The [study] title with {agents}, {replicates}, ... filled in, as plot titles are."""
    return _fill_title(doc.settings.title, _title_fields(doc, h), "[study]")


def _title_fields(doc: StudyDocument, h: Horizon) -> dict[str, Any]:
    """The values a title may name (`TITLE_FIELDS`), as the study runs (--quick included)."""
    return {
        "agents": "varied" if "data.agents" in doc.grid else study_agents(h.data),
        "replicates": h.replicates,
        "t_max": h.t_max,
        "checkpoints": h.checkpoints,
        "seed": doc.settings.seed,
    }


def plot_specs(
    tables: list[dict], scenarios, curves, title: str, columns: list[str] | None = None
) -> list[PlotSpec]:
    """The [[plot]] `tables` checked against the scenarios, curves and grid `columns` (one
    plot of every scenario and curve when there is none); titles not yet filled in."""
    names = [s.name for s in scenarios]
    curve_names = [c.name for c in curves]
    if not tables:
        return [PlotSpec("mse.png", title, "mse", tuple(names), tuple(curve_names), None, None)]
    out: list[PlotSpec] = []
    for n, table in enumerate(tables, start=1):
        where = f"plot {table['file']!r}" if isinstance(table.get("file"), str) else f"plot #{n}"
        p = build(PlotTable, table, where)
        if p.file in {q.file for q in out}:
            raise ConfigError(f"{where}: file is used by two plots; each plot needs its own file")
        chosen = names if p.scenarios is None else p.scenarios
        for name in chosen:
            if name not in names:
                raise ConfigError(
                    f"{where}: scenarios: unknown scenario {name!r}{did_you_mean(name, names)}; "
                    f"allowed: {', '.join(names)}"
                )
        for name in p.curves:
            if name not in curve_names:
                raise ConfigError(
                    f"{where}: curves: unknown curve {name!r}{did_you_mean(name, curve_names)}; "
                    f"allowed: {', '.join(curve_names) or 'none (no [[curve]] tables)'}"
                )
        if p.curves and p.metric != "mse":
            raise ConfigError(
                f"{where}: curves = {p.curves!r}: closed-form curves are of metric 'mse', "
                f"not {p.metric!r}"
            )
        if p.x != "t" and p.x not in (columns or []) and not p.x.startswith(LEDGER_PREFIX):
            raise ConfigError(
                f"{where}: x = {p.x!r}: must be 't' or a grid column "
                f"({', '.join(columns or []) or 'the study has no [grid]'}), or a privacy "
                f"ledger metric ({LEDGER_PREFIX}…)"
            )
        out.append(
            PlotSpec(
                p.file,
                p.title or title,
                p.metric,
                tuple(chosen),
                tuple(p.curves),
                tuple(p.xlim) if p.xlim else None,
                tuple(p.ylim) if p.ylim else None,
                p.x,
                p.at,
                tuple(p.dashed),
                p.xscale or ("log" if p.x == "t" or p.x.startswith(LEDGER_PREFIX) else "linear"),
                p.yscale or default_scale(p.metric),
            )
        )
    return out


def _check_plot_metrics(
    plots: list[PlotSpec], scenarios: list[ScenarioSpec], extra: list[str] | None = None
) -> None:
    """Refuse a plot of a metric no scenario records: the recorder's own (mse,
    messages_<kind>, dropped_<kind>) and `extra`, the names (glob patterns) the study's
    [study] metrics declare (`desim.kernel.registry.records`)."""
    recorded = {"mse"}
    for spec in scenarios:
        kinds = getattr(PROTOCOLS.get(spec.protocol), "message_kinds", ())
        recorded |= {f"{what}_{kind}" for kind in kinds for what in ("messages", "dropped")}
    patterns = list(extra or [])
    recorded |= {p for p in patterns if not any(c in p for c in "*?[")}
    for plot in plots:
        if not plot.scenarios:
            continue
        for key, metric in [("metric", plot.metric), *(("dashed", m) for m in plot.dashed)]:
            if metric not in recorded and not any(fnmatch.fnmatchcase(metric, p) for p in patterns):
                raise ConfigError(
                    f"plot {plot.file!r}: {key} = {metric!r}: no scenario records it"
                    f"{did_you_mean(metric, sorted(recorded))}; recorded: "
                    f"{', '.join(sorted(recorded | set(patterns)))}"
                    f"{'' if extra else ' (more with [study] metrics)'}"
                )


def _fill_title(title: str, fields: dict[str, Any], where: str) -> str:
    """`title` with {agents}, {replicates}, {t_max}, ... replaced by the study's values
    (`where` names the table in messages)."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name not in fields:
            raise ConfigError(
                f"{where}: title: unknown field {{{name}}}; allowed: "
                + ", ".join(f"{{{k}}}" for k in TITLE_FIELDS)
            )
        v = fields[name]
        if isinstance(v, int) and v >= 10_000:
            return f"{v:,}".replace(",", " ")  # 10 000: a thin grouping, as in the papers
        return "?" if v is None else str(v)

    return re.sub(r"\{([^{}]*)\}", value, title)
