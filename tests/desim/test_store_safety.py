"""Nothing a study stores is lost through desim itself: `desim export` never writes over the
study, no write in a results or figures folder follows a link planted there, file-system
errors name the real file, and Ctrl-C at any moment is one line and status 130."""

from __future__ import annotations

import errno
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from _toy import TOY_STUDY, stored_toy, toy_copy, write_study  # noqa: F401 (fixtures)

from desim.study.cli import main
from desim.study.results import run_study
from desim.study.spec import load_study
from desim.study.store import atomic_write

ROOT = Path(__file__).resolve().parents[2]
PRECIOUS = "someone else's file\n"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(".desim.lock")
    }


def _outside(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir()
    path.write_text(PRECIOUS)
    return path


# --------------------------------------------------------------------------------------------
# export


def _record(folder: Path) -> str:
    return "results/runs/" + load_study(folder).unique_runs[0].config_hash + ".parquet"


@pytest.mark.parametrize(
    "out",
    [
        "study.toml",
        "results/metrics.parquet",
        "results/manifest.json",
        "RECORD",
        "results/new.csv",
        "figures/new.csv",
        "README.md",
        "notes.csv",  # its curves file notes.curves.csv exists
    ],
)
def test_export_never_writes_over_the_study(copy, capsys, out):
    (copy / "README.md").write_text("# my notes\n")
    (copy / "notes.curves.csv").write_text("my own table\n")
    (copy / "figures").mkdir()
    before = _snapshot(copy)
    target = copy / (_record(copy) if out == "RECORD" else out)
    capsys.readouterr()
    assert main(["export", str(copy), "--format", "csv", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("desim: error: --out ") and err.count("\n") == 1, err
    assert _snapshot(copy) == before


def test_export_refuses_a_link_to_the_study_file(copy, tmp_path, capsys):
    link = tmp_path / "innocent.csv"
    link.symlink_to(copy / "study.toml")
    before = _snapshot(copy)
    assert main(["export", str(copy), "--format", "csv", "--out", str(link)]) == 2
    assert "is the study file" in capsys.readouterr().err
    assert _snapshot(copy) == before


def test_export_to_its_default_place_again_and_outside_is_fine(copy, tmp_path, capsys):
    for _ in range(2):
        assert main(["export", str(copy), "--format", "csv"]) == 0
    assert (copy / "results.csv").is_file() and (copy / "results.curves.csv").is_file()
    assert main(["export", str(copy), "--format", "parquet", "--out", str(tmp_path / "x.pq")]) == 0


def test_export_of_a_half_run_study_says_how_many_runs_are_missing(tmp_path, capsys):
    text = TOY_STUDY.replace('noise = "gaussian"', 'noise = "gaussian"\nfail_replicate = 1')
    folder = write_study(tmp_path / "half", text)
    assert run_study(load_study(folder), progress=False).failed == 1
    capsys.readouterr()
    assert main(["export", str(folder), "--format", "csv"]) == 0
    err = capsys.readouterr().err
    assert "desim: warning: exported 3 of 4 runs; 1 missing — run `desim run" in err
    assert "have results" not in err  # said once


# --------------------------------------------------------------------------------------------
# links planted in results/ and figures/


def _refused(capsys, code, args, named):
    capsys.readouterr()
    assert main(args) == code
    err = capsys.readouterr().err
    assert f"{named}: is a link" in err and "Traceback" not in err, err


@pytest.mark.parametrize("name", [".desim.lock.owner", ".desim.lock"])
def test_a_linked_lock_file_is_refused_and_the_outside_file_untouched(copy, tmp_path, capsys, name):
    outside = _outside(tmp_path)
    (copy / "results" / name).unlink(missing_ok=True)
    (copy / "results" / name).symlink_to(outside)
    _refused(capsys, 2, ["run", str(copy), "--no-progress"], f"results/{name}")
    assert outside.read_text() == PRECIOUS
    (copy / "results" / name).unlink()
    assert main(["run", str(copy), "--no-progress"]) == 0  # the lock was given back


def test_a_linked_damaged_folder_is_refused_and_nothing_moves(copy, tmp_path, capsys):
    outside = _outside(tmp_path).parent
    (copy / "results" / "runs" / "damaged").symlink_to(outside, target_is_directory=True)
    record = copy / _record(copy)
    record.write_bytes(record.read_bytes()[:-10])  # damaged: it would be set aside
    _refused(capsys, 2, ["run", str(copy), "--no-progress"], "results/runs/damaged")
    assert [p.name for p in outside.iterdir()] == ["precious.txt"]
    assert record.is_file()


def test_a_linked_figure_is_refused_and_the_outside_file_untouched(copy, tmp_path, capsys):
    outside = _outside(tmp_path)
    (copy / "figures").mkdir()
    (copy / "figures" / "toy.png").symlink_to(outside)
    _refused(capsys, 2, ["plot", str(copy)], "figures/toy.png")
    assert outside.read_text() == PRECIOUS


def test_a_linked_sidecar_is_refused_and_the_outside_file_untouched(copy, tmp_path, capsys):
    outside = _outside(tmp_path)
    sidecar = copy / _record(copy).replace(".parquet", ".json")
    sidecar.unlink()
    sidecar.symlink_to(outside)
    _refused(capsys, 1, ["run", str(copy), "--no-progress"], str(sidecar.relative_to(copy)))
    assert outside.read_text() == PRECIOUS


# --------------------------------------------------------------------------------------------
# file-system errors name the real file


def test_a_folder_where_a_figure_goes_is_named_not_the_temporary_file(copy, capsys, monkeypatch):
    (copy / "figures" / "toy.png").mkdir(parents=True)
    monkeypatch.chdir(copy)
    capsys.readouterr()
    assert main(["plot", "."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("desim: error: figures/toy.png: Is a directory"), err
    assert ".tmp" not in err and err.count("\n") == 1


def test_a_full_disk_names_the_file_being_written(tmp_path):
    path = tmp_path / "results" / "manifest.json"
    path.parent.mkdir()

    def full(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")  # the system names no file

    with pytest.raises(OSError) as info:
        atomic_write(path, full)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert list(path.parent.iterdir()) == []  # no temporary file left


# --------------------------------------------------------------------------------------------
# Ctrl-C


def test_the_command_is_the_entry_that_survives_ctrl_c():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["desim"] == "desim.study.entry:main"


def test_ctrl_c_while_the_command_imports_exits_130_in_one_line(tmp_path):
    # The child interrupts itself when the CLI first asks for pandas (a heavy import inside the
    # entry point's handler, long before the CLI is ready): deterministic on a loaded machine,
    # where a parent watching -X importtime could send the signal after the command ended.
    code = (
        "import os, signal, sys\n"
        # a shell's background job inherits SIGINT ignored: restore what a terminal gives
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pandas':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from desim.study.entry import main\n"
        "sys.exit(main())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "validate", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == ["desim: interrupted"]
