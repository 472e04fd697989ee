"""Figures of a study: one file per [[plot]], drawn from its results without running anything.

Each plot shows one metric against the slot t: one line per scenario (the mean over
replicates) with a 95% confidence band (mean ± 1.96 standard errors, computed with one
groupby, which stays fast for hundreds of runs), and the closed-form curves dashed. A study
with a grid gets one panel per grid point (at most `PANELS_PER_ROW` per row), sharing axes and
one legend.

With ``x`` a grid column the plot shows the values at one slot (``at``, default the last)
against that column instead: one line per scenario with its band, the curves dashed, and one
panel per value of the other grid columns. ``dashed`` metrics (e.g. a bound a protocol
reports) are drawn dashed in their scenario's colour, on either kind of plot. A study may have
curves only (an optimiser study): its plots then draw curves alone.

A scenario has one colour in every figure of its study, and a curve that is the closed form of
a scenario (its ``scenario`` key, or a name that starts with the scenario's name) is drawn in
that colour, dashed. Axes are log or linear per plot (`xscale`, `yscale`; by default the slot
is on a log axis, a grid column on a linear one, errors on a log axis and counts or fractions
on a linear one). Names and titles are drawn as written: a ``$`` is a dollar sign, not math.

`figure` returns a plot's matplotlib Figure (or draws a one-panel plot into a given ``ax``)
without writing anything; `draw_plot` saves that same figure, so a figure drawn in a notebook
is the file the CLI writes. Importing this module chooses no backend (the CLI chooses Agg).
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt  # the backend is the caller's (the CLI chooses Agg)
import numpy as np
import pandas as pd
import seaborn as sns

from desim.kernel.params import ConfigError
from desim.study.results import Loaded, load_results
from desim.study.spec import LEDGER_PREFIX, GridPoint, PlotSpec, Study
from desim.study.store import atomic_write

#: Resolution of written figures.
DPI = 150
#: Most panels in one row of a figure.
PANELS_PER_ROW = 4
#: Axis labels of the metrics the recorder writes (others are labelled by their name).
Y_LABELS = {"mse": "mean squared error"}
#: Matplotlib settings of every figure: no TeX (names and titles are escaped by `_text`).
RC = {"text.usetex": False}


def _text(text: str) -> str:
    """A name or title drawn as written: a ``$`` is a dollar sign, never the start of math."""
    return text.replace("$", r"\$")


def _at_point(frame: pd.DataFrame, point: GridPoint) -> pd.DataFrame:
    """The rows of `frame` at grid `point` (all rows without a grid)."""
    mask = np.ones(len(frame), dtype=bool)
    for col, value in point.columns.items():
        mask &= (frame[col] == value).to_numpy()
    return frame[mask]


def _layout(study: Study) -> tuple[int, int]:
    """(rows, columns) of panels: a table for a two-parameter grid (when its second parameter
    has at most `PANELS_PER_ROW` values), else rows of at most `PANELS_PER_ROW` panels."""
    n = len(study.points)
    grid = study.grid_columns
    if len(grid) == 2:  # rows follow the first parameter, columns the second (points in order)
        ncols = len({json.dumps(p.values[list(grid)[1]]) for p in study.points})
        if ncols <= PANELS_PER_ROW:
            return n // ncols, ncols
    ncols = min(n, PANELS_PER_ROW)
    return math.ceil(n / ncols), ncols


def colours(study: Study, spec: PlotSpec | None = None) -> dict[tuple[str, str], tuple]:
    """The colour of every scenario and curve of `study`, the same in all its figures.

    Keys are ("scenario", name) and ("curve", name); a curve paired with a scenario shares
    its colour, the other curves get colours after the scenarios'. When the study has more
    lines than the palette has well-separated colours, the unpaired curves of `spec` take
    the colours after the scenarios' in that figure (distinct within the figure).
    """
    scenarios = [s.name for s in study.scenarios]
    pairs = {c.name: study.curve_scenario(c) for c in study.curves}
    alone = [c.name for c in study.curves if pairs[c.name] is None]
    crowded = len(scenarios) + len(alone) > 10
    if crowded and spec is not None:
        alone = [c for c in spec.curves if pairs[c] is None]
    n = len(scenarios) + (0 if crowded and scenarios else len(alone))
    palette = sns.color_palette("colorblind", n) if n <= 10 else sns.color_palette("husl", n)
    # crowded: the unpaired curves (drawn dashed) take a darker palette of their own
    extra = (
        sns.color_palette("dark", max(len(alone), 1))
        if crowded and scenarios
        else palette[len(scenarios) :]
    )
    out: dict[tuple[str, str], tuple] = {}
    for i, name in enumerate(scenarios):
        out[("scenario", name)] = palette[i]
    for j, name in enumerate(alone):
        out[("curve", name)] = extra[j % len(extra)]
    for name, scenario in pairs.items():
        if scenario is not None:
            out[("curve", name)] = out[("scenario", scenario)]
    return out


def summarise(
    metrics: pd.DataFrame, metric: str, grid: list[str], log: bool = True
) -> pd.DataFrame:
    """Mean, 95% band and replicate count of `metric` per (grid point, scenario, t)."""
    rows = metrics[metrics["metric"] == metric]
    stats = (
        rows.groupby([*grid, "scenario", "t"], sort=False)["value"]
        .agg(value_mean="mean", value_std="std", value_count="count", value_min="min")
        .reset_index()
    )
    half = 1.96 * stats["value_std"].fillna(0.0) / np.sqrt(stats["value_count"])
    # The band never goes below the smallest replicate: on a log axis a band below zero would
    # vanish, and a count or a fraction is never negative.
    stats["value_low"] = np.maximum(stats["value_mean"] - half, stats["value_min"])
    stats["value_high"] = stats["value_mean"] + half
    return stats


def _finish(study: Study, spec: PlotSpec, fig, axes, n_panels: int):
    """Title and legend (every label once, even if a panel lacks a line); the figure."""
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    if n_panels == 1:
        axes.flat[0].set_title(_text(spec.title))
        if handles:
            axes.flat[0].legend(handles, labels, fontsize="small")
    else:
        fig.suptitle(_text(spec.title))
        if handles:
            fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    return fig


def _panels_figure(nrows: int, ncols: int, ax=None) -> tuple:
    """A figure with a grid of panels sharing both axes, in the house style (or the caller's
    `ax` for a one-panel plot)."""
    if ax is not None:
        if nrows * ncols != 1:
            raise ConfigError(
                f"ax: this plot has {nrows * ncols} panels (one per grid point); "
                "pass ax only for a one-panel plot, or none to get a new figure"
            )
        return ax.figure, np.array([[ax]])
    with sns.axes_style("whitegrid"):
        return plt.subplots(
            nrows,
            ncols,
            figsize=(4.6 * ncols + 2.0, 3.6 * nrows),
            squeeze=False,
            sharex=True,
            sharey=True,
            layout="constrained",
        )


def draw_figures(study: Study, loaded: Loaded | None = None) -> list[Path]:
    """Draw every plot of `study` from its current results; return the files written."""
    loaded = loaded or load_results(study)
    metrics = loaded.metrics
    if metrics.empty and not study.curve_jobs:
        raise ConfigError(f"{study.results_dir}: no finished runs to plot")
    study.figures_dir.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context(RC):
        return [draw_plot(study, spec, metrics, loaded.curves) for spec in study.plots]


def draw_plot(
    study: Study, spec: PlotSpec, metrics: pd.DataFrame, curves: pd.DataFrame | None
) -> Path:
    """Draw one [[plot]] into the figures folder and return its path."""
    return _save(study, spec, figure(study, spec, metrics, curves))


def figure(
    study: Study,
    spec: PlotSpec | str | int,
    metrics: pd.DataFrame,
    curves: pd.DataFrame | None,
    ax=None,
):
    """The matplotlib `Figure` of one [[plot]] of `study` (by spec, file name or index), drawn
    from `metrics` and `curves` exactly as `desim plot` draws its file; into `ax` when given
    (one-panel plots only). Nothing is written and no backend is chosen."""
    if not isinstance(spec, PlotSpec):
        spec = plot_spec(study, spec)
    with matplotlib.rc_context(RC):
        return _figure(study, spec, metrics, curves, ax)


def plot_spec(study: Study, which: str | int) -> PlotSpec:
    """The [[plot]] of `study` with file name (or stem) `which`, or at index `which`."""
    files = [p.file for p in study.plots]
    if isinstance(which, int) and not isinstance(which, bool) and -len(files) <= which < len(files):
        return study.plots[which]
    for p in study.plots:
        if which in (p.file, Path(p.file).stem):
            return p
    raise ConfigError(
        f"plot {which!r}: not a [[plot]] of {study.file.name}; plots: {', '.join(files) or 'none'}"
    )


def _figure(
    study: Study, spec: PlotSpec, metrics: pd.DataFrame, curves: pd.DataFrame | None, ax=None
):
    """Draw `spec` with the x axis it names: the slot, a grid column or the ε spent."""
    _check_metrics_stored(spec, metrics)
    if spec.x.startswith(LEDGER_PREFIX):
        return _draw_against_privacy(study, spec, metrics, ax)
    if spec.x != "t":
        return _draw_against_column(study, spec, metrics, curves, ax)
    return _draw_against_slot(study, spec, metrics, curves, ax)


def _check_metrics_stored(spec: PlotSpec, metrics: pd.DataFrame) -> None:
    """Refuse a plot of a metric (or dashed metric) that is not in the results."""
    available = sorted(metrics["metric"].unique())
    wanted = [("metric = ", spec.metric)] + [("dashed: metric ", m) for m in spec.dashed]
    for what, metric in wanted if spec.scenarios and not metrics.empty else ():
        if metric not in available:
            raise ConfigError(
                f"plot {spec.file!r}: {what}{metric!r}: not in the results; "
                f"available: {', '.join(available)}"
            )


def _draw_against_slot(
    study: Study, spec: PlotSpec, metrics: pd.DataFrame, curves: pd.DataFrame | None, ax=None
):
    """A [[plot]] against the slot t: one panel per grid point, scenarios and curves."""
    grid = list(study.grid_columns.values())
    log = spec.yscale == "log"
    chosen = metrics[metrics["scenario"].isin(spec.scenarios)]
    stats = summarise(chosen, spec.metric, grid, log)
    dashed = {metric: summarise(chosen, metric, grid, log) for metric in spec.dashed}
    points = study.points
    nrows, ncols = _layout(study)
    colour = colours(study, spec)
    fig, axes = _panels_figure(nrows, ncols, ax)
    for ax, point in zip(axes.flat, points, strict=False):
        here = _at_point(stats, point)
        for name in spec.scenarios:
            line = here[here["scenario"] == name]
            if line.empty:  # e.g. every replicate of it failed
                continue
            extras = []
            for metric in spec.dashed:
                extra = _at_point(dashed[metric], point)
                extras.append(extra[extra["scenario"] == name])
            _scenario_lines(ax, spec, name, colour[("scenario", name)], line, extras, "t")
        if curves is not None and spec.curves:
            here_c = _at_point(curves, point)
            for name in spec.curves:
                c = here_c[here_c["curve"] == name]
                if c.empty:
                    continue
                ax.plot(
                    c["t"],
                    c["value"],
                    ls="--",
                    color=colour[("curve", name)],
                    lw=1.4,
                    label=_text(name),
                )
        _style_panel(ax, spec, _panel_title(study, point.columns))
    _label_axes(axes, spec, len(points), ncols, "slot t")
    return _finish(study, spec, fig, axes, len(points))


def _scenario_lines(
    ax, spec: PlotSpec, name: str, color, line: pd.DataFrame, extras: list, x: str, **marker
) -> None:
    """One scenario in a panel: its mean, its band and its dashed metrics (`extras`)."""
    ax.plot(line[x], line["value_mean"], color=color, lw=1.6, **marker, label=_text(name))
    ax.fill_between(line[x], line["value_low"], line["value_high"], color=color, alpha=0.2, lw=0)
    for k, (metric, extra) in enumerate(zip(spec.dashed, extras, strict=True)):
        ax.plot(
            extra[x],
            extra["value_mean"],
            color=color,
            lw=1.2,
            ls=_DASHES[k % 3],
            label=_text(f"{name}: {metric}"),
        )


def _label_axes(axes, spec: PlotSpec, n: int, ncols: int, xlabel: str) -> None:
    """Hide the panels beyond the `n` drawn; label the x axis of the lowest panel of each
    column and the y axis of the first column."""
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.set_visible(False)
        elif k + ncols >= n:  # lowest panel of its column: label the x axis
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel(_y_label(spec.metric))


def _y_label(metric: str) -> str:
    return _text(Y_LABELS.get(metric, metric.replace("_", " ")))


def _style_panel(ax, spec: PlotSpec, title: str) -> None:
    """The plot's axis scales and limits, a light grid and the panel's title (if any)."""
    ax.set_xscale(spec.xscale)
    ax.set_yscale(spec.yscale)
    if spec.xlim:
        ax.set_xlim(*spec.xlim)
    if spec.ylim:
        ax.set_ylim(*spec.ylim)
    ax.grid(True, which="both", alpha=0.3)
    if title:
        ax.set_title(_text(title), fontsize="medium")


def _save(study: Study, spec: PlotSpec, fig) -> Path:
    path = study.figures_dir / spec.file
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format=path.suffix[1:]))
    finally:
        plt.close(fig)
    return path


#: Line styles of a plot's `dashed` metrics, in order.
_DASHES = ("--", ":", "-.")


def _panels(study: Study, x: str) -> list[dict]:
    """One {column: value} filter per panel: the distinct values of the grid columns but `x`."""
    others = [c for c in study.grid_columns.values() if c != x]
    seen: dict[str, dict] = {}
    for point in study.points:
        key = {c: point.columns[c] for c in others}
        seen.setdefault(json.dumps(key, sort_keys=True, default=str), key)
    return list(seen.values())


def _where(frame: pd.DataFrame, values: dict) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    for col, value in values.items():
        mask &= (frame[col] == value).to_numpy()
    return frame[mask]


def _at_slot(frame: pd.DataFrame, at: float | None) -> pd.DataFrame:
    """The rows of `frame` at slot `at` (None: the last slot it holds)."""
    if frame.empty:
        return frame
    return frame[frame["t"] == (frame["t"].max() if at is None else at)]


def _show(value) -> str:
    """A grid value for a panel title: a table (stored as JSON text) as ``model (k v, ...)``."""
    if isinstance(value, str) and value.startswith("{"):
        try:
            table = json.loads(value)
        except ValueError:
            return value
        model = table.pop("model", None)
        inner = ", ".join(
            f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in table.items()
        )
        return f"{model} ({inner})" if model and inner else str(model or inner)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _panel_title(study: Study, panel: dict) -> str:
    """`column = value, ...`, wrapped to fit above a panel."""
    text = ", ".join(f"{k} = {_show(v)}" for k, v in panel.items())
    return textwrap.fill(text, 44)


def _draw_against_column(
    study: Study, spec: PlotSpec, metrics: pd.DataFrame, curves: pd.DataFrame | None, ax=None
):
    """A [[plot]] whose x axis is the grid column `spec.x`, values read at slot `spec.at`."""
    grid = list(study.grid_columns.values())
    log = spec.yscale == "log"
    chosen = _at_slot(metrics[metrics["scenario"].isin(spec.scenarios)], spec.at)
    stats = {m: summarise(chosen, m, grid, log) for m in (spec.metric, *spec.dashed)}
    curve_rows = None
    if curves is not None and spec.curves:
        curve_rows = _at_slot(curves[curves["curve"].isin(spec.curves)], spec.at)
    panels = _panels(study, spec.x)
    ncols = min(len(panels), PANELS_PER_ROW)
    nrows = math.ceil(len(panels) / ncols)
    colour = colours(study, spec)
    fig, axes = _panels_figure(nrows, ncols, ax)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for name in spec.scenarios:
            where = {**panel, "scenario": name}
            line = _where(stats[spec.metric], where).sort_values(spec.x)
            if line.empty:
                continue
            extras = [_where(stats[m], where).sort_values(spec.x) for m in spec.dashed]
            color = colour[("scenario", name)]
            _scenario_lines(ax, spec, name, color, line, extras, spec.x, marker="o", ms=3.5)
        if curve_rows is not None:
            _column_curves(ax, spec, curve_rows, panel, colour)
        _style_panel(ax, spec, _panel_title(study, panel))
    _label_axes(axes, spec, len(panels), ncols, _text(study.label(spec.x)))
    return _finish(study, spec, fig, axes, len(panels))


def _column_curves(ax, spec: PlotSpec, curve_rows: pd.DataFrame, panel: dict, colour) -> None:
    """The curves of a panel against a grid column."""
    for name in spec.curves:
        c = _where(curve_rows, {**panel, "curve": name}).sort_values(spec.x)
        if c.empty:
            continue
        # curves alone are the subject of the plot (an optimiser study): draw them solid
        ax.plot(
            c[spec.x],
            c["value"],
            ls="--" if spec.scenarios else "-",
            marker=".",
            lw=1.4,
            color=colour[("curve", name)],
            label=_text(name),
        )


def _draw_against_privacy(study: Study, spec: PlotSpec, metrics: pd.DataFrame, ax=None):
    """A [[plot]] whose x axis is a privacy ledger metric: each scenario's `spec.metric`
    against the ε it has spent, both means over replicates at every checkpoint (a line that
    time walks along), by default on log–log axes; one panel per grid point."""
    if spec.x not in set(metrics["metric"]):
        raise ConfigError(
            f"plot {spec.file!r}: x = {spec.x!r}: not in the results (record it "
            'with [study] metrics = ["privacy"])'
        )
    grid = list(study.grid_columns.values())
    chosen = metrics[metrics["scenario"].isin(spec.scenarios)]
    y, x = summarise(chosen, spec.metric, grid), summarise(chosen, spec.x, grid)
    both = y.merge(x, on=[*grid, "scenario", "t"], suffixes=("", "_x"))
    nrows, ncols = _layout(study)
    colour = colours(study, spec)
    fig, axes = _panels_figure(nrows, ncols, ax)
    for ax, point in zip(axes.flat, study.points, strict=False):
        here = _at_point(both, point)
        for name in spec.scenarios:
            color = colour[("scenario", name)]
            line = here[(here["scenario"] == name) & (here["value_mean_x"] > 0)].sort_values("t")
            if line.empty:
                continue
            ax.plot(
                line["value_mean_x"],
                line["value_mean"],
                color=color,
                lw=1.6,
                marker=".",
                label=_text(name),
            )
            ax.plot(
                line["value_mean_x"].iloc[-1],
                line["value_mean"].iloc[-1],
                color=color,
                marker="o",
                ms=6,
            )  # where the run ends
        _style_panel(ax, spec, point.label if point.columns else "")
    for k, ax in enumerate(axes.flat):
        if k >= len(study.points):
            ax.set_visible(False)
        elif k + ncols >= len(study.points):
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel(f"ε spent ({spec.x})")
    for ax in axes[:, 0]:
        ax.set_ylabel(_y_label(spec.metric))
    return _finish(study, spec, fig, axes, len(study.points))
