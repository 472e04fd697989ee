"""studies/colme-fig2/explore.ipynb runs from top to bottom (loads the committed results,
plots them, runs one extra scenario) and writes nothing into the study folder."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

STUDY = Path(__file__).resolve().parents[2] / "studies" / "colme-fig2"


def listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.slow
def test_explore_notebook_runs():
    before = listing(STUDY)
    nb = nbformat.read(STUDY / "explore.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(STUDY)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the figures were drawn
    assert listing(STUDY) == before
