"""Study folders you can trust: results tied to the study file's current configuration, one
writer, failing or damaged state that never costs good results, grid de-duplication, suites,
verify and clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from _toy import TOY_STUDY, write_study

import desim.study.results as results
from desim.kernel.params import ConfigError
from desim.study.cli import main
from desim.study.results import load_results, run_study
from desim.study.spec import load_study
from desim.study.store import StudyLock

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def metrics_bytes(folder: Path) -> bytes:
    return (folder / "results" / "metrics.parquet").read_bytes()


# --------------------------------------------------------------------------------------------
# results belong to the current study file


def test_edit_then_plot_and_summary_show_no_stale_data(toy_study, capsys):
    assert main(["run", str(toy_study), "--no-progress"]) == 0
    edited = TOY_STUDY.replace("agents = 6", "agents = 4").replace('"Toy B"', '"Toy renamed"')
    write_study(toy_study, edited)
    capsys.readouterr()
    # nothing of the current file has run yet: say so, never show the old numbers
    assert main(["summary", str(toy_study)]) == 2
    err = capsys.readouterr().err
    assert "no results of the current study.toml" in err and "4 stored runs" in err
    assert main(["plot", str(toy_study)]) == 2
    # after running the new version, only its runs are shown, and the old ones are counted
    assert main(["run", str(toy_study), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["summary", str(toy_study)]) == 0
    out, err = capsys.readouterr()
    assert "Toy renamed" in out and "Toy B" not in out
    assert "4 stored runs of an older version of study.toml" in err
    loaded = load_results(load_study(toy_study))
    assert set(loaded.metrics.scenario) == {"Toy A", "Toy renamed"}


def test_edit_without_rerun_plots_only_what_is_current(toy_study, capsys):
    assert main(["run", str(toy_study), "--no-progress"]) == 0
    write_study(
        toy_study, TOY_STUDY.replace('noise = "gaussian"', 'noise = "gaussian"\nepsilon = 3.0')
    )
    loaded = load_results(load_study(toy_study))
    assert set(loaded.metrics.scenario) == {"Toy A"}  # Toy B changed: its old runs are stale
    assert any("2 of 4 runs have results" in n for n in loaded.notes)
    assert any("2 stored runs of an older version" in n for n in loaded.notes)


def test_two_study_files_in_one_folder_stay_apart(tmp_path, capsys):
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "s1.toml").write_text(TOY_STUDY.replace('name = "Toy B"', 'name = "Only in s1"'))
    (folder / "s2.toml").write_text(TOY_STUDY.replace('name = "Toy B"', 'name = "Only in s2"'))
    for name in ("s1.toml", "s2.toml"):
        assert main(["run", str(folder / name), "--no-progress"]) == 0
    assert (folder / "results-s1").is_dir() and (folder / "results-s2").is_dir()
    assert (folder / "figures-s1" / "toy.png").is_file()
    capsys.readouterr()
    assert main(["summary", str(folder / "s1.toml")]) == 0
    out = capsys.readouterr().out
    assert "Only in s1" in out and "Only in s2" not in out


def test_results_hold_no_absolute_path(toy_study):
    run_study(load_study(toy_study), progress=False)
    for path in (toy_study / "results").rglob("*.json"):
        assert str(toy_study) not in path.read_text(), path


# --------------------------------------------------------------------------------------------
# one writer


def test_a_second_writer_exits_at_once_naming_the_holder(toy_study, capsys):
    study = load_study(toy_study)
    with StudyLock(study.results_dir):
        assert main(["run", str(toy_study), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"desim process {os.getpid()}" in err
    assert not (toy_study / "results" / "runs").exists()  # nothing was run


def test_a_lock_left_by_a_killed_process_is_recovered(toy_study):
    code = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from desim.study.store import StudyLock
        StudyLock(Path({str(toy_study / "results")!r})).__enter__()
        os._exit(9)  # killed while holding the lock
    """)
    subprocess.run([sys.executable, "-c", code], check=False, timeout=60)
    assert (toy_study / "results" / ".desim.lock.owner").exists()  # it never cleaned up
    assert run_study(load_study(toy_study), progress=False).done == 4


SLOW_STUDY = """\
[study]
title = "slow"
replicates = 3
t_max = 20000
checkpoints = 10

[data]
model = "classes"
agents = 400
class_means = [0.2, 0.8]

[[scenario]]
name = "local"
protocol = "local"

[[scenario]]
name = "ideal"
protocol = "ideal"
"""


@pytest.mark.slow
def test_two_concurrent_runs_leave_one_result_per_run_and_no_traceback(tmp_path):
    folder = write_study(tmp_path / "race", SLOW_STUDY)
    cmd = [sys.executable, "-m", "desim.study.cli", "run", str(folder), "--no-progress"]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    for _, err in outs:
        assert "Traceback" not in err, err
    assert codes[0] == 0 and codes[1] in (0, 2), outs
    study = load_study(folder)
    runs = folder / "results" / "runs"
    assert sorted(p.name for p in runs.glob("*.parquet")) == sorted(
        f"{r.config_hash}.parquet" for r in study.runs
    )
    assert not list(runs.glob(".*.tmp"))
    man = json.loads((folder / "results" / "manifest.json").read_text())
    assert man["counts"]["done"] == len(study.runs)
    # each run was run once: the loser ran nothing (or came after and found all done)
    assert sum(i["ran"] for i in man["invocations"]) == len(study.runs)


# --------------------------------------------------------------------------------------------
# failures and damage never cost good results


def test_a_failing_invocation_never_shrinks_results(toy_study, monkeypatch, capsys):
    run_study(load_study(toy_study), progress=False)
    before = metrics_bytes(toy_study)
    write_study(toy_study, TOY_STUDY.replace("sigma = 0.5", "sigma = 0.7"))

    def broken(scenario):
        raise MemoryError("no room")

    monkeypatch.setattr(results, "run_scenario", broken)
    summary = run_study(load_study(toy_study), progress=False)
    assert summary.failed == 4 and summary.done == 0
    assert metrics_bytes(toy_study) == before  # the earlier, good table is still there
    assert len(list((toy_study / "results" / "runs").glob("*.parquet"))) == 4
    # and it is the older version's: it is not shown as the current file's
    with pytest.raises(ConfigError, match="no results of the current study.toml"):
        load_results(load_study(toy_study))
    write_study(toy_study)  # back to the first version: everything is there, nothing re-runs
    monkeypatch.undo()
    assert run_study(load_study(toy_study), progress=False).skipped == 4


def test_a_non_finite_value_is_refused_before_anything_is_touched(toy_study, capsys, no_figures):
    assert main(["run", str(toy_study), "--no-progress"]) == 0
    before = metrics_bytes(toy_study)
    write_study(toy_study, TOY_STUDY.replace("sigma = 0.5", "sigma = inf"))
    capsys.readouterr()
    assert main(["run", str(toy_study), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sigma = inf" in err and "finite" in err
    assert metrics_bytes(toy_study) == before


def test_a_damaged_record_is_named_set_aside_and_run_again(toy_study, capsys, no_figures):
    study = load_study(toy_study)
    run_study(study, progress=False)
    before = metrics_bytes(toy_study)
    path = toy_study / "results" / "runs" / f"{study.runs[1].config_hash}.parquet"
    data = bytearray(path.read_bytes())
    data[40:104] = bytes(b ^ 0xFF for b in data[40:104])  # 64 flipped bytes
    path.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["run", str(toy_study), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"runs/damaged/{path.name}: damaged record" in err
    assert (toy_study / "results" / "runs" / "damaged" / path.name).is_file()
    assert metrics_bytes(toy_study) == before  # re-run: the same numbers


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_metrics_table_is_rebuilt_from_the_records(toy_study, capsys, damage):
    run_study(load_study(toy_study), progress=False)
    good = pd.read_parquet(toy_study / "results" / "metrics.parquet")
    path = toy_study / "results" / "metrics.parquet"
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[200:264] = bytes(b ^ 0xFF for b in data[200:264])
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    loaded = load_results(load_study(toy_study))
    pd.testing.assert_frame_equal(loaded.metrics, good, check_exact=True)
    assert any("rebuilt from them" in n for n in loaded.notes)
    assert main(["summary", str(toy_study)]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_filesystem_trouble_is_one_line(toy_study, capsys, monkeypatch, no_figures):
    (toy_study / "results").mkdir()
    (toy_study / "results" / "runs").write_text("not a folder")
    assert main(["run", str(toy_study), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file" in err
    (toy_study / "results" / "runs").unlink()
    (toy_study / "results" / "metrics.parquet").mkdir()
    assert main(["run", str(toy_study), "--no-progress"]) == 2
    assert "is a folder" in capsys.readouterr().err
    (toy_study / "results" / "metrics.parquet").rmdir()
    assert main(["run", str(toy_study), "--no-progress"]) == 0
    before = metrics_bytes(toy_study)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", "metrics.parquet")

    write_study(toy_study, TOY_STUDY.replace("sigma = 0.5", "sigma = 0.6"))
    monkeypatch.setattr(results, "write_parquet", full)
    capsys.readouterr()
    assert main(["run", str(toy_study), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err
    assert "Traceback" not in err
    assert metrics_bytes(toy_study) == before


@pytest.mark.parametrize("link", ["quick", "results"])
def test_links_out_of_the_study_folder_are_not_followed(tmp_path, capsys, link):
    folder = write_study(tmp_path / "s")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".precious.tmp").write_text("someone else's file")
    (folder / link).symlink_to(elsewhere, target_is_directory=True)
    args = ["run", str(folder), "--no-progress"] + (["--quick"] if link == "quick" else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "leads out of the study folder" in err
    assert sorted(p.name for p in elsewhere.iterdir()) == [".precious.tmp"]


def test_long_scenario_names_are_fine_files_are_named_by_hash(tmp_path):
    name = "a very long scenario name " * 12
    folder = write_study(tmp_path / "s", TOY_STUDY.replace('"Toy B"', f'"{name.strip()}"'))
    summary = run_study(load_study(folder), progress=False)
    assert summary.ok and summary.done == 4


# --------------------------------------------------------------------------------------------
# grids run what differs


LOCAL_ONLY = """\
[study]
title = "local over an epsilon grid"
seed = 3
replicates = 2
t_max = 200
checkpoints = 8

[data]
model = "classes"
agents = 6
class_means = [0.2, 0.8]

[[scenario]]
name = "local"
protocol = "local"

[[curve]]
name = "toy curve"
kind = "toy-local"

[grid]
"defaults.scale" = [1.0, 2.0]
"""


def test_grid_deduplication_halves_the_runs_with_identical_numbers(tmp_path):
    folder = write_study(tmp_path / "s", LOCAL_ONLY)
    study = load_study(folder)
    assert len(study.runs) == 4 and len(study.unique_runs) == 2  # `local` has no `scale`
    summary = run_study(study, progress=False)
    assert summary.done == 2
    m = pd.read_parquet(folder / "results" / "metrics.parquet")
    assert sorted(m.scale.unique()) == [1.0, 2.0]  # shown at every grid point
    a = m[m.scale == 1.0].drop(columns="scale").reset_index(drop=True)
    b = m[m.scale == 2.0].drop(columns="scale").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    c = pd.read_parquet(folder / "results" / "curves.parquet")
    assert (c[c.scale == 2.0].value.to_numpy() == 2 * c[c.scale == 1.0].value.to_numpy()).all()


def test_a_scenario_reached_by_the_grid_runs_at_every_point(tmp_path):
    folder = write_study(tmp_path / "s", TOY_STUDY + '[grid]\n"defaults.epsilon" = [0.5, 2.0]\n')
    study = load_study(folder)
    assert len(study.unique_runs) == len(study.runs) == 8


def test_curves_are_cached_by_config_hash(toy_study):
    run_study(load_study(toy_study), progress=False)
    write_study(
        toy_study, TOY_STUDY.replace('noise = "gaussian"', 'noise = "gaussian"\nepsilon = 3.0')
    )
    run_study(load_study(toy_study), progress=False)
    man = json.loads((toy_study / "results" / "manifest.json").read_text())
    assert [i["curves_computed"] for i in man["invocations"]] == [1, 0]


# --------------------------------------------------------------------------------------------
# suites, verify, clean and small CLI things


def test_a_suite_is_validated_run_and_summarised_sub_study_by_sub_study(tmp_path, capsys):
    write_study(tmp_path / "suite" / "b")
    write_study(tmp_path / "suite" / "a", TOY_STUDY.replace('"Toy B"', '"Toy C"'))
    suite = str(tmp_path / "suite")
    assert main(["validate", suite]) == 0
    out = capsys.readouterr().out
    assert out.count("ok: 4 runs") == 2 and "suite" in out and "2 studies" in out
    assert main(["run", suite, "--no-progress"]) == 0
    assert (tmp_path / "suite" / "a" / "results" / "metrics.parquet").is_file()
    capsys.readouterr()
    assert main(["summary", suite]) == 0
    out = capsys.readouterr().out
    assert out.index("Toy C") < out.index("Toy B")  # sub-studies in name order


def test_a_suite_is_validated_whole_before_anything_runs_and_has_one_progress_bar(tmp_path, capsys):
    write_study(tmp_path / "suite" / "a")
    write_study(tmp_path / "suite" / "b", TOY_STUDY.replace("replicates = 2", "replicates = 0"))
    suite = str(tmp_path / "suite")
    assert main(["run", suite]) == 2  # b is bad: nothing runs, not even a
    assert "replicates" in capsys.readouterr().err
    assert not (tmp_path / "suite" / "a" / "results").exists()
    write_study(tmp_path / "suite" / "b", TOY_STUDY.replace('"Toy B"', '"Toy C"'))
    assert main(["run", suite]) == 0
    err = capsys.readouterr().err
    # one bar over the 8 runs of both sub-studies, none per sub-study
    assert "8/8" in err and "4/4" not in err


def test_plots_of_names_no_listed_metric_records_are_refused_by_validate(tmp_path, capsys):
    listed = 'checkpoints = 8\nmetrics = ["accuracy", "privacy"]'
    base = TOY_STUDY.replace("checkpoints = 8", listed).replace('curves = ["toy curve"]', "")
    # a protocol that releases privately, or validate refuses "privacy" as recorded by none
    base = base.replace('"toy-local-mean"\nnoise', '"private-colme"\nnoise')
    for metric, ok in (("outside_0.1", True), ("eps_one_max", True), ("outside_0.2", False)):
        text = base.replace('file = "toy.png"', f'file = "toy.png"\nmetric = "{metric}"')
        write_study(tmp_path / metric, text)
        assert (main(["validate", str(tmp_path / metric)]) == 0) is ok
        err = capsys.readouterr().err
        if not ok:
            assert "metric = 'outside_0.2': no scenario records it" in err
            assert "did you mean 'outside_0.1'" in err and len(err.strip().splitlines()) == 1


def test_a_curve_beyond_its_limits_is_refused_by_validate(tmp_path, capsys):
    study = TOY_STUDY.replace("agents = 6", "agents = 30") + textwrap.dedent("""
        [[curve]]
        name = "exact oracle"
        kind = "oracle"
        method = "exact"
        """)
    write_study(tmp_path / "s", study)
    assert main(["validate", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "curve 'exact oracle'" in err and "method = 'exact' needs agents ≤ 21" in err
    assert len(err.strip().splitlines()) == 1


def test_verify_reports_changed_fingerprints(toy_study, capsys, no_figures):
    assert main(["run", str(toy_study), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["verify", str(toy_study), "--no-progress"]) == 0
    assert "verified 4 runs: 4 identical, 0 changed" in capsys.readouterr().out
    study = load_study(toy_study)
    side = toy_study / "results" / "runs" / f"{study.runs[3].config_hash}.json"
    data = json.loads(side.read_text())
    data["fingerprint"] = "0" * 64  # the sidecar no longer describes its record
    side.write_text(json.dumps(data))
    assert main(["verify", str(toy_study), "--sample", "4", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "1 garbled" in captured.out and f"results/runs/{side.name}" in captured.err


def test_clean_removes_older_versions_after_confirmation(toy_study, capsys, monkeypatch):
    run_study(load_study(toy_study), progress=False)
    write_study(toy_study, TOY_STUDY.replace("sigma = 0.5", "sigma = 0.6"))
    run_study(load_study(toy_study), progress=False)
    runs = toy_study / "results" / "runs"
    assert len(list(runs.glob("*.parquet"))) == 8
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    assert main(["clean", str(toy_study)]) == 2  # no terminal to ask: needs --yes
    assert "--yes" in capsys.readouterr().err
    assert main(["clean", str(toy_study), "--yes"]) == 0
    assert "removed 8 files" in capsys.readouterr().out
    assert len(list(runs.glob("*.parquet"))) == 4
    assert run_study(load_study(toy_study), progress=False).skipped == 4


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("desim 0.")


def test_a_closed_pipe_ends_quietly(tmp_path):
    folder = write_study(
        tmp_path / "s",
        SLOW_STUDY.replace("t_max = 20000", "t_max = 50").replace(
            "replicates = 3", "replicates = 1"
        ),
    )
    run_study(load_study(folder), progress=False)
    # the reader goes away before desim writes: as `desim summary ... | head -0` does
    proc = subprocess.Popen(
        [sys.executable, "-m", "desim.study.cli", "summary", str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_a_bad_at_lists_the_checkpoints(toy_study, capsys):
    run_study(load_study(toy_study), progress=False)
    assert main(["summary", str(toy_study), "--at", "100"]) == 2
    err = capsys.readouterr().err
    assert "--at 100: no checkpoint at that slot; checkpoints: 1, " in err and ", 50" in err


def test_topology_warnings_are_recorded_and_printed_once(tmp_path, capsys, no_figures):
    text = TOY_STUDY.replace("agents = 6", "agents = 12") + textwrap.dedent("""
        [topology]
        model = "erdos-renyi"
        p = 0.05
    """)
    folder = write_study(tmp_path / "s", text)
    assert main(["run", str(folder), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.count("desim: warning: ") >= 1 and "disconnected" in err
    assert "generators.py" not in err  # a line, not a raw Python warning with a source path
    man = json.loads((folder / "results" / "manifest.json").read_text())
    assert any("disconnected" in w for w in man["warnings"])


# --------------------------------------------------------------------------------------------
# the bundled studies' committed results


BUNDLED = sorted(p.parent for p in (ROOT / "studies").rglob("study.toml") if "quick" not in p.parts)


@pytest.mark.parametrize("folder", BUNDLED, ids=[str(p.relative_to(ROOT)) for p in BUNDLED])
def test_bundled_results_load_as_current_without_absolute_paths(folder):
    study = load_study(folder)
    state = results.scan(study)
    assert len(state.sidecars) == len(study.unique_runs) and state.stale == 0
    manifest = results.read_manifest(study)
    assert manifest["schema"] == results.MANIFEST_SCHEMA
    text = (study.results_dir / "manifest.json").read_text()
    assert "/work/" not in text and "/home/" not in text
    loaded = load_results(study)
    # no note: metrics.parquet matches its checksum and the records it was built from (else it
    # would be rebuilt, with a note saying so), and every run and curve is current
    assert not loaded.notes
    if study.curve_jobs:
        assert len(loaded.curves) > 0


SMALL = [
    pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name == "latency-whatif" else [])
    for p in BUNDLED
    if p.name in ("colme-fig2", "latency-whatif")
]


@pytest.mark.parametrize("folder", SMALL)
def test_migrated_records_rebuild_metrics_byte_identical(folder, tmp_path):
    """The one-off migration renamed records and added sidecars; the metrics table the current
    code builds from them equals the committed metrics.parquet byte for byte (the migration
    checked every bundled study; two of them are checked again here)."""
    copy = tmp_path / folder.name  # the study without its metrics table: rebuilt on loading
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("figures", "quick"))
    (copy / "results" / "metrics.parquet").unlink()
    loaded = load_results(load_study(copy))
    assert not loaded.notes  # no damaged record
    committed = folder / "results" / "metrics.parquet"
    pd.testing.assert_frame_equal(loaded.metrics, pd.read_parquet(committed), check_exact=True)
    older = _older_writer(committed)
    if older:
        pytest.skip(f"{older}: the bytes of a parquet file name the versions that wrote it")
    path = tmp_path / "metrics.parquet"
    results.write_parquet(loaded.metrics, path)
    assert path.read_bytes() == committed.read_bytes()


def _older_writer(path: Path) -> str:
    """Which installed writer (pyarrow, pandas) is older than the one that wrote `path`: the
    file records both versions, and pandas before 3 writes its strings as `string`, not
    `large_string` (the lowest versions CI tests)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from packaging.version import Version

    meta = pq.ParquetFile(path).metadata
    wrote = {
        "pyarrow": meta.created_by.rsplit(" ", 1)[-1],
        "pandas": json.loads(meta.metadata[b"pandas"])["pandas_version"],
    }
    installed = {"pyarrow": pa.__version__, "pandas": pd.__version__}
    return ", ".join(
        f"{name} {installed[name]} (written by {wrote[name]})"
        for name in wrote
        if Version(installed[name]) < Version(wrote[name])
    )


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_workers_end_with_their_parent(tmp_path):
    import signal
    import time

    folder = write_study(
        tmp_path / "s",
        SLOW_STUDY.replace("t_max = 20000", "t_max = 2000000").replace(
            "replicates = 3", "replicates = 4"
        ),
    )
    code = (
        "import sys; from desim.study.results import run_study; "
        "from desim.study.spec import load_study; "
        f"run_study(load_study({str(folder)!r}), workers=2, progress=False)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while len(workers := _children(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(workers) >= 2
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(map(_alive, workers))
    finally:
        for pid in _children(parent.pid):
            os.kill(pid, signal.SIGKILL)


def test_a_curve_takes_its_scenarios_colour_and_the_key_leaves_hashes_alone(tmp_path):
    from desim.study.plots import colours

    plain = load_study(write_study(tmp_path / "a"))
    text = TOY_STUDY.replace('kind = "toy-local"', 'kind = "toy-local"\nscenario = "Toy B"')
    paired = load_study(write_study(tmp_path / "b", text))
    assert paired.curve_scenario(paired.curves[0]) == "Toy B"
    c = colours(paired)
    assert c[("curve", "toy curve")] == c[("scenario", "Toy B")] != c[("scenario", "Toy A")]
    assert paired.config_hash == plain.config_hash  # a figure-only key
    assert paired.curve_jobs[0].config_hash == plain.curve_jobs[0].config_hash
    with pytest.raises(ConfigError, match="scenario = 'Toy Z': must name a"):
        load_study(
            write_study(tmp_path / "c", text.replace('scenario = "Toy B"', 'scenario = "Toy Z"'))
        )
