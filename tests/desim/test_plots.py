"""Figures: the 95% band, one panel per grid point, and plots of other metrics."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from _toy import TOY_STUDY, write_study

from desim.kernel.params import ConfigError
from desim.study.plots import draw_figures, summarise
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
    assert width > 2 * height  # 2 rows × 3 columns of panels
    assert not list((folder / "figures").glob(".*.tmp"))


def test_other_metrics_and_formats_can_be_plotted(tmp_path):
    text = TOY_STUDY + '\n[[plot]]\nfile = "pings.svg"\nmetric = "messages_ping"\n'
    folder = write_study(tmp_path / "s", text)
    study = load_study(folder)
    run_study(study, progress=False)
    paths = draw_figures(study)
    assert [p.name for p in paths] == ["toy.png", "pings.svg"]
    assert "messages ping" in paths[1].read_text()  # the axis label, as words


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
