"""Figures: the 95% band, one panel per grid point, plots of other metrics, and figures a
reader does not stumble on (legends off the data, a marker beside every colour, labelled log
axes and metrics, titles that fit, the same bytes from the same results)."""

from __future__ import annotations

import colorsys
import math

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from _toy import TOY_STUDY, write_study
from matplotlib.text import Text

import desim
from desim.kernel.params import ConfigError
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import METRICS
from desim.study.cli import main
from desim.study.plots import colours, draw_figures, markers, metric_label, summarise
from desim.study.results import run_study
from desim.study.spec import load_study


def test_summary_is_mean_and_a_1_96_standard_error_band_kept_above_the_smallest_replicate():
    values = [1.0, 2.0, 3.0, 6.0]
    frame = pd.DataFrame(
        {
            "scenario": ["a"] * 4 + ["b"],
            "replicate": [0, 1, 2, 3, 0],
            "t": [1.0] * 5,
            "metric": ["mse"] * 5,
            "value": [*values, 5.0],
        }
    )
    stats = summarise(frame, "mse", []).set_index("scenario")
    half = 1.96 * np.std(values, ddof=1) / 2
    assert stats.loc["a", "value_mean"] == pytest.approx(3.0)
    assert 3.0 - half < 1.0  # the band would reach below every replicate (and, often, 0)
    assert stats.loc["a", "value_low"] == pytest.approx(1.0)
    assert stats.loc["a", "value_high"] == pytest.approx(3.0 + half)
    # one replicate: no band
    assert stats.loc["b", "value_low"] == stats.loc["b", "value_high"] == 5.0


@pytest.mark.slow
def test_grid_gives_one_panel_per_point(tmp_path):
    grid = '[grid]\n"data.agents" = [4, 6]\n"defaults.epsilon" = [0.5, 1.0, 2.0]\n'
    text = TOY_STUDY.replace("replicates = 2", "replicates = 1") + grid
    folder = write_study(tmp_path / "s", text)
    study = load_study(folder)
    run_study(study, progress=False)
    (path,) = draw_figures(study)
    assert path == folder / "figures" / "toy.png"
    height, width, _ = mpimg.imread(path).shape
    assert width > 1.5 * height  # 2 rows × 3 columns of panels (and a legend below)
    assert not list((folder / "figures").glob(".*.tmp"))


def test_other_metrics_and_formats_can_be_plotted(tmp_path):
    text = TOY_STUDY + '\n[[plot]]\nfile = "pings.svg"\nmetric = "messages_ping"\n'
    folder = write_study(tmp_path / "s", text)
    study = load_study(folder)
    run_study(study, progress=False)
    paths = draw_figures(study)
    assert [p.name for p in paths] == ["toy.png", "pings.svg"]
    assert "ping messages sent (total)" in paths[1].read_text()  # the axis label, as words


def test_a_metric_missing_from_results_is_a_config_error(tmp_path):
    text = TOY_STUDY.replace('curves = ["toy curve"]', 'metric = "bits"')
    folder = write_study(tmp_path / "s", text)
    # refused before any run: no scenario of the study records it
    with pytest.raises(
        ConfigError,
        match="metric = 'bits': no scenario records it; recorded: dropped_ping, messages_ping, mse",
    ):
        load_study(folder)
    # [study] metrics add the names they declare (`records`)
    folder = write_study(
        tmp_path / "u", text.replace("checkpoints = 8", 'checkpoints = 8\nmetrics = ["accuracy"]')
    )
    with pytest.raises(
        ConfigError, match="recorded: dropped_ping, messages_ping, mse, outside_0.1, within_0.1$"
    ):
        load_study(folder)
    # a metric that declares nothing: the names are known only after a run, refused when drawing
    folder = write_study(
        tmp_path / "t",
        text.replace("checkpoints = 8", 'checkpoints = 8\nmetrics = ["toy-undeclared"]'),
    )
    study = load_study(folder)
    run_study(study, progress=False)
    with pytest.raises(
        ConfigError, match="metric = 'bits': not in the results; available: messages_ping, mse"
    ):
        draw_figures(study)


def test_curves_only_go_with_the_mse_metric(tmp_path):
    text = TOY_STUDY.replace('title = "Toy"', 'title = "Toy"\nmetric = "messages_ping"')
    with pytest.raises(ConfigError, match="curves are of metric 'mse'"):
        load_study(write_study(tmp_path / "s", text))


def test_a_grid_column_may_share_a_name_with_a_statistic():
    """A swept parameter called `mean` (e.g. network.latency.mean) is a column like any other."""
    frame = pd.DataFrame(
        {
            "mean": [1.0, 1.0, 2.0],
            "scenario": ["a"] * 3,
            "replicate": [0, 1, 0],
            "t": [1.0] * 3,
            "metric": ["mse"] * 3,
            "value": [1.0, 3.0, 5.0],
        }
    )
    stats = summarise(frame, "mse", ["mean"]).set_index("mean")
    assert stats.loc[1.0, "value_mean"] == 2.0 and stats.loc[2.0, "value_mean"] == 5.0


# --- figures a reader does not stumble on -------------------------------------------------


def _ran(folder, text: str = TOY_STUDY):
    """The toy study `text` written to `folder` and run: its loaded results (no figure file is
    drawn: the tests draw the figures they look at)."""
    summary = run_study(load_study(write_study(folder, text)), progress=False)
    assert summary.ok
    return desim.load(folder)


def _drawn(fig):
    """`fig` laid out as it would be saved (no file written)."""
    fig.draw_without_rendering()
    return fig


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_a_legend_never_sits_on_the_data_and_a_long_title_is_wrapped_inside(tmp_path):
    title = "A long title " + "that goes on and on " * 6 + "(end)"
    res = _ran(tmp_path / "s", TOY_STUDY.replace('title = "Toy"', f'title = "{title}"'))
    fig = _drawn(res.plot("toy"))
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # right of the panel, outside it
    assert fig.bbox.contains(legend.x1 - 1, legend.y0 + 1)  # and inside the figure
    (suptitle,) = [t for t in fig.get_children() if isinstance(t, Text) and "(end)" in t.get_text()]
    assert "\n" in suptitle.get_text()
    box = suptitle.get_window_extent()
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1  # not clipped
    plt.close(fig)


def test_a_grid_has_one_legend_below_its_panels_in_a_font_that_grows_with_the_figure(tmp_path):
    single = _ran(tmp_path / "one")
    fig = _drawn(single.plot("toy"))
    one_pt = fig.axes[0].get_legend().get_texts()[0].get_fontsize()
    plt.close(fig)
    grid = '[grid]\n"defaults.epsilon" = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]\n'
    res = _ran(tmp_path / "grid", TOY_STUDY.replace("replicates = 2", "replicates = 1") + grid)
    fig = _drawn(res.plot("toy"))
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 6 and all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert box.y1 <= min(ax.get_tightbbox().y0 for ax in panels) + 1  # below every panel
    assert not any(_overlap(box, ax.get_window_extent()) for ax in panels)
    assert box.y0 >= fig.bbox.y0 and box.x0 >= fig.bbox.x0 and box.x1 <= fig.bbox.x1
    assert legend.get_texts()[0].get_fontsize() > one_pt
    plt.close(fig)


@pytest.mark.slow  # 18 panels take seconds to draw; the 6-panel legend test runs by default
def test_an_18_panel_grid_has_a_legend_that_fits_in_as_many_columns_as_fit(tmp_path):
    # a grid over a key only the curve reads: 18 panels from one run per scenario
    scales = ", ".join(str(1 + k) for k in range(18))
    names = "".join(
        f'\n[[scenario]]\nname = "a scenario with a long name, number {k}"\n'
        'protocol = "toy-local-mean"\n'
        for k in range(8)
    )
    text = TOY_STUDY.replace("replicates = 2", "replicates = 1") + names
    folder = write_study(tmp_path / "s", f'{text}\n[grid]\n"defaults.scale" = [{scales}]\n')
    run_study(load_study(folder), progress=False)
    fig = _drawn(desim.load(folder).plot("toy"))
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 18
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0
    texts = legend.get_texts()
    ticks = [t.get_fontsize() for ax in panels for t in ax.get_xticklabels()]
    assert texts[0].get_fontsize() >= max(ticks)
    # as many columns as fit: the legend in one row fewer would not fit the figure
    rows = len({round(t.get_window_extent().y0) for t in texts})
    assert rows > 1  # (11 long entries do not fit one row)
    wider = fig.legend(
        legend.legend_handles,
        [t.get_text() for t in texts],
        ncols=math.ceil(len(texts) / (rows - 1)),
        fontsize=texts[0].get_fontsize(),
    )
    assert wider.get_window_extent(fig.canvas.get_renderer()).width > fig.bbox.width
    plt.close(fig)


def test_every_line_has_a_marker_as_well_as_a_colour_and_closed_forms_are_dashed(tmp_path):
    text = TOY_STUDY.replace('kind = "toy-local"', 'kind = "toy-local"\nscenario = "Toy B"')
    text += '\n[[plot]]\nfile = "curves.png"\nscenarios = []\ncurves = ["toy curve"]\n'
    res = _ran(tmp_path / "s", text)
    fig = res.plot("toy")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    a, b, curve = lines["Toy A"], lines["Toy B"], lines["toy curve"]
    assert a.get_marker() != b.get_marker() and a.get_color() != b.get_color()
    assert a.get_linestyle() == b.get_linestyle() == "-"  # simulated: solid, filled markers
    assert a.get_markerfacecolor() == a.get_color()
    # the closed form of Toy B: its colour and marker, dashed, hollow markers
    assert (curve.get_color(), curve.get_marker()) == (b.get_color(), b.get_marker())
    assert curve.get_linestyle() == "--" and curve.get_markerfacecolor() == "none"
    plt.close(fig)
    fig = res.plot("curves")  # a plot of curves alone: they are its subject, drawn solid
    (alone,) = fig.axes[0].get_lines()
    assert alone.get_linestyle() == "-" and alone.get_markerfacecolor() != "none"
    plt.close(fig)


def test_ten_scenarios_get_ten_markers_and_the_first_five_hues_stay_apart(tmp_path):
    scenarios = "".join(
        f'\n[[scenario]]\nname = "S{k}"\nprotocol = "toy-local-mean"\n' for k in range(8)
    )
    study = load_study(write_study(tmp_path / "s", TOY_STUDY + scenarios))
    keys = [("scenario", s.name) for s in study.scenarios]
    assert len(keys) == 10
    assert len({markers(study)[k] for k in keys}) == 10
    hues = [colorsys.rgb_to_hsv(*colours(study)[k])[0] for k in keys[:5]]
    gaps = [min(abs(h - g), 1 - abs(h - g)) for i, h in enumerate(hues) for g in hues[:i]]
    assert min(gaps) > 0.05  # e.g. no orange beside vermilion among the first five


def test_a_log_axis_spanning_less_than_a_decade_has_several_labelled_ticks(tmp_path):
    text = TOY_STUDY.replace('title = "Toy"', 'title = "Toy"\nylim = [0.006, 0.025]')
    fig = _drawn(_ran(tmp_path / "s", text).plot("toy"))
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    labelled = [
        t.get_text()
        for t in ax.get_yticklabels()
        if t.get_text() and lo <= t.get_position()[1] <= hi
    ]
    assert len(labelled) >= 3, labelled
    plt.close(fig)


def test_every_metric_desim_records_has_a_label_saying_what_it_measures():
    load_plugins()
    names = [n for _, fn in METRICS.items() for n in getattr(fn, "outputs", ())]
    plain = [n for n in names if not any(c in n for c in "*?[")]
    assert {"wrong_dropped", "outside_0.1", "bound"} <= set(plain)
    for name in [*plain, "mse", "messages_query", "dropped_query"]:
        assert metric_label(name) != name.replace("_", " "), name
    assert metric_label("eps_one_max") == "ε spent against one querier (max over agents)"
    assert metric_label("eps_server_mean") == "ε spent against the server (mean over agents)"
    assert metric_label("my_own") == "my own"  # a plug-in's metric: its name, as words


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_the_same_results_draw_the_same_bytes(tmp_path, suffix):
    text = TOY_STUDY.replace('file = "toy.png"', f'file = "toy.{suffix}"')
    assert main(["run", str(write_study(tmp_path / "s", text)), "--no-progress"]) == 0
    path = tmp_path / "s" / "figures" / f"toy.{suffix}"
    first = path.read_bytes()
    assert main(["plot", str(tmp_path / "s")]) == 0
    assert path.read_bytes() == first


def test_a_scenario_whose_every_value_is_nan_is_left_out_of_its_figure(tmp_path):
    folder = write_study(tmp_path / "s", TOY_STUDY.replace("replicates = 2", "replicates = 1"))
    study = load_study(folder)
    run_study(study, progress=False)
    path = folder / "results" / "metrics.parquet"
    metrics = pd.read_parquet(path)
    first = metrics["scenario"].iloc[0]
    metrics.loc[metrics["scenario"] == first, "value"] = np.nan  # e.g. 0/0 in every run
    metrics.to_parquet(path)
    (figure,) = draw_figures(study)
    assert figure.stat().st_size > 10_000
