"""Fixtures of the desim tests: the toy plug-ins, a small toy study folder (fresh, or as `desim
run` left it) and a dask cluster."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _toy import write_study  # importing _toy registers the toy protocol and curve


@pytest.fixture
def toy_study(tmp_path: Path) -> Path:
    """A fresh folder holding the toy study."""
    return write_study(tmp_path / "toy")


@pytest.fixture(scope="session")
def toy_ran(tmp_path_factory) -> Path:
    """The toy study as `desim run` leaves it (results and figures), run once per session."""
    from desim.study.cli import main

    folder = write_study(tmp_path_factory.mktemp("toy-ran") / "toy")
    assert main(["run", str(folder), "--no-progress"]) == 0
    return folder


@pytest.fixture
def toy_run(toy_ran: Path, tmp_path: Path) -> Path:
    """A fresh copy of the toy study after `desim run` (a test may change it)."""
    return Path(shutil.copytree(toy_ran, tmp_path / "toy"))


# Per module, not per session: an idle cluster still spends CPU (heartbeats of its scheduler,
# nannies and workers) for as long as it lives, and only the dask test modules use it.
@pytest.fixture(scope="module")
def dask_cluster():
    """A client of desim's own ``local:2`` cluster (two forked worker processes, 127.0.0.1
    only), shared by the tests of one dask module; they pass its address to desim as a remote
    one's."""
    pytest.importorskip("distributed")
    from desim.study.dask import connect

    with connect("local:2") as client:
        yield client
