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
curves only (an optimiser study): its plots then draw curves alone, solid (they are the
subject of the plot, not a reference beside simulations).

Every line has two channels, so that lines of close hues stay apart: a colour and a marker.
A scenario has one colour and one marker in every figure of its study, and a curve that is the
closed form of a scenario (its ``scenario`` key, or a name that starts with the scenario's name)
takes both, drawn dashed with hollow markers. The legend sits outside the panels (right of a
single panel, below a grid), so it never hides data. Axes are log or linear per plot (`xscale`,
`yscale`; by default the slot is on a log axis, a grid column on a linear one, errors on a log
axis and counts or fractions on a linear one); a log axis spanning few decades gets ticks at 2
and 5 times the powers of ten (or every multiple), so it always has several labels. A metric is
labelled by what it measures (`metric_label`). Names and titles are drawn as written: a ``$`` is
a dollar sign, not math.

`figure` returns a plot's matplotlib Figure (or draws a one-panel plot into a given ``ax``)
without writing anything; `draw_plot` saves that same figure, so a figure drawn in a notebook
is the file the CLI writes. Importing this module chooses no backend (the CLI chooses Agg).
The same results give the same bytes (the SVG ids are salted and no date is written).
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt  # the backend is the caller's (the CLI chooses Agg)
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import text_to_path

from desim.kernel.params import ConfigError
from desim.study.results import Loaded, load_agents, load_results
from desim.study.spec import LEDGER_PREFIX, GridPoint, PlotSpec, Study
from desim.study.spec.figures import agent_ledger_metric
from desim.study.store import atomic_write
from desim.study.summary import QUANTILES

#: Resolution of written figures.
DPI = 150
#: Most panels in one row of a figure.
PANELS_PER_ROW = 4
#: Size (inches) of one panel; a figure adds its margins, title and legend around its panels.
PANEL_SIZE = (4.6, 3.6)
#: Palette of up to 10 lines: distinct hues ('colorblind' puts orange beside vermilion and
#: two pinks within five lines); more lines get evenly spaced hues ('husl').
PALETTE = "tab10"
#: Markers of the lines in order, the channel that separates lines whatever their hue.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p")
#: Font sizes (points) of the legend and the title of a one-panel figure; a larger figure
#: scales both up (to at most `MAX_FONT_SCALE` times), since it is shown shrunk.
LEGEND_PT = 9.0
TITLE_PT = 12.0
MAX_FONT_SCALE = 1.7
#: Axis labels of the metrics desim records: what each measures. A name missing here is drawn
#: with its underscores as spaces; ``messages_<kind>``, ``dropped_<kind>`` and the privacy
#: ledger's ``eps_<who>_<stat>`` are labelled by `metric_label`.
METRIC_LABELS = {
    "mse": "mean squared error",
    "within_0.1": "share of agents within 0.1 of their mean",
    "outside_0.1": "share of agents more than 0.1 from their mean",
    "wrong_kept": "links kept across classes (ordered pairs)",
    "wrong_dropped": "links dropped within a class (ordered pairs)",
    "bound": "upper bound on the MSE",
    "expected_mse": "expected MSE (exact)",
    "sigma": "noise standard deviation σ",
    "cor1_rhs": "Corollary 1's bound on σ²_DP",
    "cor1_epsilon": "ε above which Corollary 1 holds",
    "class_components": "class components K",
    "small_share": "share of agents with |C̃_a| ≤ 2",
    "cor1_sigma2_dp": "noise variance σ²_DP",
    "cor1_holds": "share of runs with σ²_DP below Corollary 1's bound",
    "eb_uploads": "uploads in the server's latest round",
    "stale": "releases discarded as stale (total)",
    "timed_out": "releases discarded as timed out (total)",
    "repeated": "answers re-sent unchanged (total)",
    "budget_exhausted": "share of agents at their budget (withheld or degraded a release)",
    "budget_withheld": "releases withheld by privacy budgets (total)",
    "mse_honest": "mean squared error of the honest agents",
    "accepting_adversaries": "share of honest agents accepting an adversary",
    "adversaries_accepted": "adversaries accepted per honest agent",
    "lost_in_flight": "messages lost in flight to a change of their link (total)",
}
#: Who a privacy ledger metric ``eps_<who>_<stat>`` measures the ε against, and over what.
LEDGER_WHO = {
    "one": "one querier",
    "all": "all queriers colluding",
    "neighbour": "one neighbour",
    "server": "the server",
}
LEDGER_STAT = {"max": "max over agents", "mean": "mean over agents"}
#: Matplotlib settings of every figure: no TeX (names and titles are escaped by `_text`), and
#: SVG element ids from a fixed salt (else random), so the same results give the same file.
RC = {"text.usetex": False, "svg.hashsalt": "desim"}
#: File metadata that would differ between two drawings of the same results (the date).
_NO_DATE = {"svg": {"Date": None}, "pdf": {"CreationDate": None, "ModDate": None}}
#: Line styles of a plot's `dashed` metrics, in order.
_DASHES = ("--", ":", "-.")
#: Marker size (points) of the lines: at every point of a line against a grid column, and
#: every `_MARK_STEP` of the axes' diagonal on a line against the slot (which has many points).
_MARKER_PT = 5.0
_MARK_STEP = 0.1


def _text(text: str) -> str:
    """A name or title drawn as written: a ``$`` is a dollar sign, never the start of math."""
    return text.replace("$", r"\$")


def metric_label(metric: str) -> str:
    """The axis label of `metric`: what it measures (its name, underscores as spaces, when
    desim does not know it)."""
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric]
    what, _, kind = metric.partition("_")
    if what in ("messages", "dropped") and kind:
        return f"{kind} messages {'sent' if what == 'messages' else 'dropped'} (total)"
    if metric.startswith(LEDGER_PREFIX):
        return _ledger_label(metric[len(LEDGER_PREFIX) :]) or metric.replace("_", " ")
    return metric.replace("_", " ")


def _ledger_label(name: str) -> str | None:
    """The label of a privacy ledger name after ``eps_``: ``<who>_<stat>`` over agents,
    ``<who>`` per agent, either after ``rdp_`` for the RDP accountant's (None: not one)."""
    rdp = name.startswith("rdp_")
    name = name[4:] if rdp else name
    who, _, stat = name.rpartition("_")
    if stat not in LEDGER_STAT:
        who, stat = name, ""
    if who not in LEDGER_WHO:
        return None
    over = LEDGER_STAT.get(stat, "per agent") + (", RDP" if rdp else "")
    return f"ε spent against {LEDGER_WHO[who]} ({over})"


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
    palette = sns.color_palette(PALETTE, n) if n <= 10 else sns.color_palette("husl", n)
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


def markers(study: Study) -> dict[tuple[str, str], str]:
    """The marker of every scenario and curve of `study` (keys as in `colours`), the same in
    all its figures: the scenarios' in order, then the unpaired curves'; a curve paired with a
    scenario shares its marker."""
    scenarios = [s.name for s in study.scenarios]
    pairs = {c.name: study.curve_scenario(c) for c in study.curves}
    out = {("scenario", name): MARKERS[i % len(MARKERS)] for i, name in enumerate(scenarios)}
    alone = [name for name, scenario in pairs.items() if scenario is None]
    for j, name in enumerate(alone):
        out[("curve", name)] = MARKERS[(len(scenarios) + j) % len(MARKERS)]
    for name, scenario in pairs.items():
        if scenario is not None:
            out[("curve", name)] = out[("scenario", scenario)]
    return out


def _looks(study: Study, spec: PlotSpec) -> dict[tuple[str, str], dict]:
    """Colour and marker of every line of `spec`, as keyword arguments of `Axes.plot`."""
    colour, marker = colours(study, spec), markers(study)
    return {key: {"color": colour[key], "marker": marker[key]} for key in colour}


def _every(k: int, along_slot: bool):
    """Where the `k`-th line of a figure puts its markers: at every point against a grid column;
    against the slot every `_MARK_STEP` of the axes' diagonal, from a start that differs
    between neighbouring lines so that their markers do not pile up where the lines meet."""
    return (_MARK_STEP * (k % 5) / 5, _MARK_STEP) if along_slot else None


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


def _legend_entries(axes) -> tuple[list, list[str]]:
    """(handles, labels) of every panel, each label once (even if a panel lacks its line)."""
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    return list(legend.values()), list(legend)


def _text_inches(chars: int, points: float) -> float:
    """The width of `chars` characters of text at `points` (an average character is about
    0.6 em wide): a layout estimate that needs no renderer, so every backend lays out alike."""
    return chars * 0.6 * points / 72


def _legend_right(ax, handles: list, labels: list[str], points: float) -> float:
    """A legend right of `ax`, outside it; its width in inches (handle, padding and text)."""
    ax.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        fontsize=points,
    )
    return _text_inches(max(map(len, labels)) + 6, points)


def _legend_below(fig, handles: list, labels: list[str], points: float) -> float:
    """A legend below the panels of `fig`, in as many columns as fit its width; its height
    in inches."""
    ncol = _legend_columns(labels, points, fig.get_figwidth() - 0.4)
    fig.legend(handles, labels, loc="outside lower center", ncols=ncol, fontsize=points)
    return math.ceil(len(labels) / ncol) * 1.6 * points / 72 + 0.3


def _legend_columns(labels: list[str], points: float, width: float) -> int:
    """The most columns in which a legend of `labels` at `points` fits `width` inches, every
    row as full as the others. Each column is as wide as its own longest label (measured from
    the font, which needs no renderer), as matplotlib fills a legend column by column."""
    font = FontProperties(size=points)
    texts = [text_to_path.get_text_width_height_descent(x, font, ismath=False)[0] for x in labels]
    em, n = points, len(labels)
    for most in range(n, 1, -1):
        ncol = math.ceil(n / math.ceil(n / most))  # the same rows in fewer, fuller columns
        rows, longer = divmod(n, ncol)  # matplotlib's split: the first columns one longer
        sizes = [rows + 1] * longer + [rows] * (ncol - longer)
        starts = np.cumsum([0, *sizes[:-1]])
        columns = [max(texts[a : a + k]) for a, k in zip(starts, sizes, strict=True)]
        # legend padding 2 × 0.4 em, handle 2 em and its gap 0.8 em, 2 em between columns
        need = sum(columns) + em * (0.8 + 2.8 * ncol + 2.0 * (ncol - 1))
        if need <= width * 72:
            return ncol
    return 1


def _title(title: str, width: float, points: float) -> str:
    """`title` as drawn, wrapped to lines that fit `width` inches at `points`."""
    fits = max(20, int(width * 72 / (0.6 * points)) - 2)
    return textwrap.fill(_text(title), fits)


def _finish(spec: PlotSpec, fig, axes, n_panels: int, own: bool):
    """Title and one legend outside the panels (every label once): right of a single panel,
    below a grid of panels; the figure grows to make room, so its panels keep their size, and
    a larger figure gets larger fonts (it is shown shrunk). The caller's `ax` (`own` false)
    gets its title and a legend at its right, and its figure keeps its size."""
    handles, labels = _legend_entries(axes)
    if not own:
        ax = axes.flat[0]
        ax.set_title(_title(spec.title, ax.figure.get_figwidth(), TITLE_PT), fontsize=TITLE_PT)
        if handles:
            _legend_right(ax, handles, labels, LEGEND_PT)
        return fig
    width, height = fig.get_size_inches()
    one = PANEL_SIZE[0] + 1.0
    scale = 1.0 if n_panels == 1 else min(MAX_FONT_SCALE, math.sqrt(width / one))
    if handles and n_panels == 1:
        width += _legend_right(axes.flat[0], handles, labels, LEGEND_PT)
    elif handles:
        height += _legend_below(fig, handles, labels, LEGEND_PT * scale)
    fig.suptitle(_title(spec.title, width, TITLE_PT * scale), fontsize=TITLE_PT * scale)
    fig.set_size_inches(width, height)
    return fig


def _panels_figure(nrows: int, ncols: int, ax=None) -> tuple:
    """(figure, panels, own): a new figure with a grid of panels sharing both axes, in the
    house style (`own`), or the caller's `ax` for a one-panel plot."""
    if ax is not None:
        if nrows * ncols != 1:
            raise ConfigError(
                f"ax: this plot has {nrows * ncols} panels (one per grid point); "
                "pass ax only for a one-panel plot, or none to get a new figure"
            )
        return ax.figure, np.array([[ax]]), False
    with sns.axes_style("whitegrid"):
        fig, axes = plt.subplots(
            nrows,
            ncols,
            figsize=(PANEL_SIZE[0] * ncols + 1.0, PANEL_SIZE[1] * nrows + 0.6),
            squeeze=False,
            sharex=True,
            sharey=True,
            layout="constrained",
        )
    return fig, axes, True


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
    (one-panel plots only). A plot of every agent's ε (``eps_<who>``) reads the study's
    per-agent results instead. Nothing is written and no backend is chosen."""
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
    if agent_ledger_metric(spec.metric):  # every agent's ε: from the per-agent results
        return _draw_agent_spread(study, spec, load_agents(study), ax)
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
    nrows, ncols = _layout(study)
    look = _looks(study, spec)
    fig, axes, own = _panels_figure(nrows, ncols, ax)
    for ax, point in zip(axes.flat, study.points, strict=False):
        here = _at_point(stats, point)
        for k, name in enumerate(spec.scenarios):
            line = here[here["scenario"] == name]
            if line.empty or line["value_mean"].isna().all():  # every replicate failed or NaN
                continue
            extras = []
            for metric in spec.dashed:
                extra = _at_point(dashed[metric], point)
                extras.append(extra[extra["scenario"] == name])
            every = _every(k, True)
            _scenario_lines(ax, spec, name, look[("scenario", name)], line, extras, "t", every)
        if curves is not None and spec.curves:
            here_c = _at_point(curves, point)
            for k, name in enumerate(spec.curves, start=len(spec.scenarios)):
                c = here_c[here_c["curve"] == name]
                if not c.empty:
                    _curve_line(ax, spec, name, c, "t", look[("curve", name)], _every(k, True))
        _style_panel(ax, spec, _panel_title(study, point.columns))
    _label_axes(axes, spec, len(study.points), ncols, "slot t")
    return _finish(spec, fig, axes, len(study.points), own)


def _scenario_lines(
    ax, spec: PlotSpec, name: str, look: dict, line: pd.DataFrame, extras: list, x: str, every
) -> None:
    """One scenario in a panel: its mean (solid, filled markers), its band and its dashed
    metrics (`extras`, hollow markers)."""
    marks = {**look, "markevery": every, "ms": _MARKER_PT}
    ax.plot(line[x], line["value_mean"], lw=1.6, **marks, label=_text(name))
    ax.fill_between(
        line[x], line["value_low"], line["value_high"], color=look["color"], alpha=0.2, lw=0
    )
    for k, (metric, extra) in enumerate(zip(spec.dashed, extras, strict=True)):
        ax.plot(
            extra[x],
            extra["value_mean"],
            lw=1.2,
            ls=_DASHES[k % 3],
            mfc="none",
            **marks,
            label=_text(f"{name}: {metric_label(metric)}"),
        )


def _curve_line(ax, spec: PlotSpec, name: str, c: pd.DataFrame, x: str, look: dict, every):
    """A closed-form curve: dashed with hollow markers beside simulated lines; solid with
    filled markers in a plot of curves alone, whose subject it is."""
    alone = not spec.scenarios
    ax.plot(
        c[x],
        c["value"],
        ls="-" if alone else "--",
        lw=1.4,
        **look,
        markevery=every,
        ms=_MARKER_PT,
        mfc=look["color"] if alone else "none",
        label=_text(name),
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
        ax.set_ylabel(_text(metric_label(spec.metric)))


class _LogTicks(mticker.LogLocator):
    """Major ticks of a log axis: the powers of ten, and also 2 and 5 times them when the axis
    spans less than two decades, or the multiples in `fine` when it spans less than one (one
    power of ten, or none, would be its only label)."""

    def __init__(self, fine: tuple[float, ...]):
        super().__init__(base=10.0)
        self.fine = fine

    def tick_values(self, vmin, vmax):
        """The ticks between `vmin` and `vmax`, multiples chosen by how many decades they span."""
        lo, hi = sorted((vmin, vmax))
        decades = math.log10(hi / lo) if 0 < lo < hi < math.inf else math.inf
        subs = (1.0,) if decades >= 2 else (1.0, 2.0, 5.0) if decades >= 1 else self.fine
        self.set_params(subs=np.array(subs))
        return super().tick_values(vmin, vmax)


def _log_ticks(axis, fine: tuple[float, ...]) -> None:
    """Label every major tick of a log `axis` (`_LogTicks`) and no minor one."""
    axis.set_major_locator(_LogTicks(fine))
    # infinite thresholds: label every major tick, not only the powers of ten
    axis.set_major_formatter(mticker.LogFormatterSciNotation(minor_thresholds=(math.inf, 0)))
    axis.set_minor_formatter(mticker.NullFormatter())


def _style_panel(ax, spec: PlotSpec, title: str) -> None:
    """The plot's axis scales and limits, a light grid and the panel's title (if any)."""
    ax.set_xscale(spec.xscale)
    ax.set_yscale(spec.yscale)
    if spec.xscale == "log":  # labels side by side: fewer multiples than on the y axis
        _log_ticks(ax.xaxis, (1.0, 2.0, 3.0, 5.0))
    if spec.yscale == "log":
        _log_ticks(ax.yaxis, tuple(float(k) for k in range(1, 10)))
    if spec.xlim:
        ax.set_xlim(*spec.xlim)
    if spec.ylim:
        ax.set_ylim(*spec.ylim)
    ax.grid(True, which="both", alpha=0.3)
    if title:
        ax.set_title(_text(title), fontsize="medium")


def _save(study: Study, spec: PlotSpec, fig) -> Path:
    path = study.figures_dir / spec.file
    kind = path.suffix[1:]
    meta = _NO_DATE.get(kind)
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format=kind, metadata=meta))
    finally:
        plt.close(fig)
    return path


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
    look = _looks(study, spec)
    fig, axes, own = _panels_figure(nrows, ncols, ax)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for name in spec.scenarios:
            where = {**panel, "scenario": name}
            line = _where(stats[spec.metric], where).sort_values(spec.x)
            if line.empty:
                continue
            extras = [_where(stats[m], where).sort_values(spec.x) for m in spec.dashed]
            _scenario_lines(ax, spec, name, look[("scenario", name)], line, extras, spec.x, None)
        if curve_rows is not None:
            for name in spec.curves:
                c = _where(curve_rows, {**panel, "curve": name}).sort_values(spec.x)
                if not c.empty:
                    _curve_line(ax, spec, name, c, spec.x, look[("curve", name)], None)
        _style_panel(ax, spec, _panel_title(study, panel))
    _label_axes(axes, spec, len(panels), ncols, _text(study.label(spec.x)))
    return _finish(spec, fig, axes, len(panels), own)


def _draw_against_privacy(study: Study, spec: PlotSpec, metrics: pd.DataFrame, ax=None):
    """A [[plot]] whose x axis is a privacy ledger metric: each scenario's `spec.metric`
    against the ε it has spent, both means over replicates at every checkpoint (a line that
    time walks along, a large marker where it ends), by default on log–log axes; one panel per
    grid point."""
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
    look = _looks(study, spec)
    fig, axes, own = _panels_figure(nrows, ncols, ax)
    for ax, point in zip(axes.flat, study.points, strict=False):
        here = _at_point(both, point)
        for k, name in enumerate(spec.scenarios):
            line = here[(here["scenario"] == name) & (here["value_mean_x"] > 0)].sort_values("t")
            if line.empty:
                continue
            marks = {**look[("scenario", name)], "ms": _MARKER_PT}
            xs, ys = line["value_mean_x"], line["value_mean"]
            ax.plot(xs, ys, lw=1.6, markevery=_every(k, True), **marks, label=_text(name))
            ax.plot(xs.iloc[-1], ys.iloc[-1], **{**marks, "ms": 2 * _MARKER_PT})  # the end
        _style_panel(ax, spec, point.label if point.columns else "")
    _label_axes(axes, spec, len(study.points), ncols, _text(metric_label(spec.x)))
    return _finish(spec, fig, axes, len(study.points), own)


def _draw_agent_spread(study: Study, spec: PlotSpec, agents: pd.DataFrame | None, ax=None):
    """A [[plot]] of a per-agent ε (``eps_<who>``): per grid point a row of two panels, the
    median over agents against the slot t with a band from the 5 to the 95 % quantile, and the
    histogram over agents at the last checkpoint (t_max); the agents of every replicate are
    pooled, and each scenario keeps its colour and marker."""
    if ax is not None:
        raise ConfigError(
            f"ax: plot {spec.file!r} draws two panels per grid point (the spread against t and "
            "the histogram at t_max); pass no ax to get a new figure"
        )
    if agents is None or spec.metric not in agents.columns:
        raise ConfigError(
            f"plot {spec.file!r}: metric = {spec.metric!r}: not in the per-agent results "
            '(agents.parquet); record it with [study] per_agent = true and metrics = ["privacy"]'
        )
    grid = list(study.grid_columns.values())
    keep = agents["scenario"].isin(spec.scenarios) & agents[spec.metric].notna()
    chosen = agents.loc[keep, [*grid, "scenario", "replicate", "t", spec.metric]]
    if chosen.empty:
        raise ConfigError(
            f"plot {spec.file!r}: metric = {spec.metric!r}: no agent of its scenarios has a "
            "value (their protocols release nothing private, or no run has finished)"
        )
    spread = (
        chosen.groupby([*grid, "scenario", "t"], sort=False)[spec.metric]
        .quantile(list(QUANTILES))
        .unstack()
        .reset_index()
    )
    last = chosen.groupby([*grid, "scenario", "replicate"], sort=False)["t"].transform("max")
    final = chosen[chosen["t"] == last]
    look = _looks(study, spec)
    with sns.axes_style("whitegrid"):
        fig, axes = plt.subplots(
            len(study.points),
            2,
            figsize=(PANEL_SIZE[0] * 2 + 1.0, PANEL_SIZE[1] * len(study.points) + 0.6),
            squeeze=False,
            layout="constrained",
        )
    for (band, hist), point in zip(axes, study.points, strict=True):
        here, at_end = _at_point(spread, point), _at_point(final, point)
        for k, name in enumerate(spec.scenarios):
            line = here[here["scenario"] == name].sort_values("t")
            if line.empty:
                continue
            marks = {**look[("scenario", name)], "ms": _MARKER_PT}
            every = _every(k, True)
            band.plot(line["t"], line[0.5], lw=1.6, markevery=every, **marks, label=_text(name))
            band.fill_between(
                line["t"], line[0.05], line[0.95], color=marks["color"], alpha=0.2, lw=0
            )
        _style_panel(band, spec, _panel_title(study, point.columns))
        band.set_xlabel("slot t")
        band.set_ylabel(_text(metric_label(spec.metric)) + "\nmedian, 5–95 % of agents")
        _agent_histogram(hist, spec, at_end, look)
    return _finish(spec, fig, axes, 2 * len(study.points), True)


def _agent_histogram(ax, spec: PlotSpec, final: pd.DataFrame, look: dict) -> None:
    """The share of agents per bin of their ε at the last checkpoint, one outline per
    scenario (bins shared within the panel)."""
    values = final[spec.metric].to_numpy(float)
    edges = np.histogram_bin_edges(values, bins=20) if len(values) else 20
    for name in spec.scenarios:
        mine = final.loc[final["scenario"] == name, spec.metric].to_numpy(float)
        if len(mine):
            colour = look[("scenario", name)]["color"]
            weights = np.full(len(mine), 1.0 / len(mine))
            ax.hist(mine, bins=edges, weights=weights, histtype="step", lw=1.6, color=colour)
    ax.set_xscale(spec.yscale)
    if spec.ylim:
        ax.set_xlim(*spec.ylim)
    ax.grid(True, alpha=0.3)
    t_end = final["t"].max() if len(final) else float("nan")
    ax.set_title(f"at t = {t_end:g}", fontsize="medium")
    ax.set_xlabel(_text(metric_label(spec.metric)))
    ax.set_ylabel("share of agents")
