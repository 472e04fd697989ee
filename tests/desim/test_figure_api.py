"""Plot functions for notebooks: a Figure, drawn into `ax=` if given, identical to the CLI's
file, and no backend forced by importing desim."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest
from _toy import TOY_STUDY, write_study
from matplotlib.figure import Figure

import desim
from desim.study.cli import main
from desim.study.plots import DPI


def test_importing_desim_chooses_no_backend():
    code = (
        "import desim, desim.study.plots, desim.study.export, matplotlib; "
        "print(matplotlib.get_backend())"
    )
    env = {**os.environ, "MPLBACKEND": "svg"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "svg"  # the user's choice stands (it was forced to Agg)


def test_notebook_figure_is_the_cli_file(toy_run):
    written = mpimg.imread(toy_run / "figures" / "toy.png")
    fig = desim.load(toy_run).plot("toy.png")
    assert isinstance(fig, Figure)
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format="png")
    plt.close(fig)
    buf.seek(0)
    np.testing.assert_array_equal(mpimg.imread(buf), written)


def test_plot_draws_into_a_given_ax(toy_run, tmp_path):
    res = desim.load(toy_run)
    fig, ax = plt.subplots()
    assert res.plot(0, ax=ax) is fig
    assert [line.get_label() for line in ax.get_lines()] == ["Toy A", "Toy B", "toy curve"]
    plt.close(fig)
    with pytest.raises(desim.ConfigError, match="not a \\[\\[plot\\]\\]"):
        res.plot("nope.png")
    grid = write_study(tmp_path / "g", TOY_STUDY + '[grid]\n"defaults.epsilon" = [0.5, 2.0]\n')
    main(["run", str(grid), "--no-progress"])
    fig, ax = plt.subplots()
    with pytest.raises(desim.ConfigError, match="2 panels"):
        desim.load(grid).plot(0, ax=ax)
    plt.close(fig)
    fig = desim.load(grid).plot("toy")  # a new figure with both panels
    assert len([a for a in fig.axes if a.get_visible()]) == 2
    plt.close(fig)
