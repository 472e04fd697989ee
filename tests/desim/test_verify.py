"""`desim verify` verifies what is stored: every damaged, missing, garbled or orphaned file of a
results folder is named (relative to the study folder) and the exit status is 1; a re-run that
differs is "changed", with where each was computed; `--sample` draws anew each time, printing
its seed, and `--seed` repeats a draw. `desim clean` acts only on the folder it is given."""

from __future__ import annotations

import json
import re
import shutil
import sys

import pandas as pd
import pytest
from _toy import TOY_STUDY, stored_toy, toy_copy, write_study  # noqa: F401 (fixtures)

import desim.study.verify as verify
from desim.study.cli import main
from desim.study.results import run_study
from desim.study.spec import load_study
from desim.study.store import parquet_bytes


def _runs(folder):
    study = load_study(folder)
    return study, folder / "results" / "runs"


def _verify(folder, capsys, *extra):
    capsys.readouterr()
    code = main(["verify", str(folder), "--no-progress", *extra])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


def test_an_intact_study_verifies_identical(copy, capsys):
    code, out, err = _verify(copy, capsys)
    assert code == 0, err
    assert "6 stored files checked: 0 damaged, 0 missing, 0 garbled, 0 orphaned" in out
    assert "verified 4 runs: 4 identical, 0 changed, 0 failed" in out


def _edit_value(runs, h):
    """A value changed inside the record: still valid parquet, its sidecar untouched."""
    path = runs / f"{h}.parquet"
    frame = pd.read_parquet(path)
    frame.loc[3, "value"] = frame.loc[3, "value"] * 1.5
    path.write_bytes(parquet_bytes(frame))


def _garble(runs, h):
    (runs / f"{h}.json").write_text('{"config_hash": ', encoding="utf-8")


def _other_hash(runs, h):
    side = json.loads((runs / f"{h}.json").read_text())
    side["config_hash"] = "f" * 64
    (runs / f"{h}.json").write_text(json.dumps(side))


def _orphan(runs, h):
    shutil.copy(runs / f"{h}.parquet", runs / f"{'a' * 64}.parquet")


DAMAGE = {
    # name: (damage, kind, file named, words in the line)
    "value edited": (_edit_value, "damaged", "{h}.parquet", "sha256 differs"),
    "sidecar garbled": (_garble, "garbled", "{h}.json", "not JSON"),
    "sidecar deleted": (
        lambda runs, h: (runs / f"{h}.json").unlink(),
        "missing",
        "{h}.parquet",
        "manifest.json says run toy-b_r001 is done",
    ),
    "record deleted": (
        lambda runs, h: (runs / f"{h}.parquet").unlink(),
        "missing",
        "{h}.parquet",
        "listed by its sidecar",
    ),
    "both deleted": (
        lambda runs, h: [(runs / f"{h}{s}").unlink() for s in (".json", ".parquet")],
        "missing",
        "{h}.parquet",
        "no record of run toy-b_r001, though manifest.json says it is done",
    ),
    "config hash edited": (_other_hash, "garbled", "{h}.json", "is not its file name's"),
    "orphaned record": (_orphan, "orphaned", "a" * 64 + ".parquet", "belongs to no run"),
    "stray file": (
        lambda runs, h: (runs / "notes.txt").write_text("mine"),
        "orphaned",
        "notes.txt",
        "not a file desim writes",
    ),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_every_damaged_missing_garbled_or_orphaned_file_is_named(copy, capsys, name):
    damage, kind, named, words = DAMAGE[name]
    study, runs = _runs(copy)
    h = study.unique_runs[3].config_hash  # toy-b_r001
    damage(runs, h)
    code, out, err = _verify(copy, capsys)
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith(f"desim: {kind}: ")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"desim: {kind}: results/runs/{named.format(h=h)}: ")
    assert words in lines[0]
    assert f"1 {kind}" in out


def test_a_damaged_table_is_named(copy, capsys):
    path = copy / "results" / "metrics.parquet"
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF
    path.write_bytes(bytes(data))
    code, _, err = _verify(copy, capsys, "--sample", "0")
    assert code == 1
    assert "desim: damaged: results/metrics.parquet: its sha256 differs" in err


def test_a_changed_rerun_is_named_with_where_each_was_computed(copy, capsys, monkeypatch):
    study, runs = _runs(copy)
    simulate = verify.simulate

    def upgraded(run):  # as if a new numpy changed the last bit of one run's values
        metrics, agents, notes = simulate(run)
        if run.run_id == "toy-a_r001":
            metrics["value"] = metrics["value"] * (1 + 2**-52)
        return metrics, agents, notes

    monkeypatch.setattr(verify, "simulate", upgraded)
    side = json.loads((runs / f"{study.unique_runs[1].config_hash}.json").read_text())
    side["provenance"].update(numpy="1.0.0", cpu="Elsewhere CPU", cpu_simd=["X86_V4"])
    (runs / f"{study.unique_runs[1].config_hash}.json").write_text(json.dumps(side))
    code, out, err = _verify(copy, capsys)
    assert code == 1
    assert "verified 4 runs: 3 identical, 1 changed" in out
    (line,) = [x for x in err.splitlines() if x.startswith("desim: changed: ")]
    assert "toy-a_r001 (results/runs/" in line and "differs from the stored one" in line
    assert "computed with numpy 1.0.0 on cpu Elsewhere CPU (SIMD X86_V4); here numpy" in line
    assert "(relative)" in line and "damaged" not in err


def test_an_edited_fingerprint_is_a_garbled_sidecar_not_a_change(copy, capsys):
    study, runs = _runs(copy)
    path = runs / f"{study.unique_runs[2].config_hash}.json"
    side = json.loads(path.read_text())
    side["fingerprint"] = "0" * 64
    path.write_text(json.dumps(side))
    code, out, err = _verify(copy, capsys)
    assert code == 1
    assert f"desim: garbled: results/runs/{path.name}: its fingerprint" in err
    assert "4 identical, 0 changed" in out


def test_a_sample_is_drawn_anew_each_time_and_repeated_by_its_seed(copy, capsys):
    seeds = []
    for _ in range(2):
        code, out, err = _verify(copy, capsys, "--sample", "2")
        assert code == 0 and "verified 2 runs" in out
        seeds.append(int(re.search(r"seed (\d+) \(`--seed \1` draws them again\)", err)[1]))
    assert seeds[0] != seeds[1]  # drawn from the OS: 32 bits
    study = load_study(copy)
    first = verify.verify_study(study, 2, seeds[0])
    again = verify.verify_study(study, 2, seeds[0])
    assert first.checked == again.checked and first.seed == seeds[0] and len(first.checked) == 2
    drawn = {tuple(verify.verify_study(study, 2, s).checked) for s in range(12)}
    assert len(drawn) > 1  # the seed matters
    code, _, err = _verify(copy, capsys, "--sample", "2", "--seed", str(seeds[0]))
    assert code == 0 and f"seed {seeds[0]}" in err


def test_seed_without_sample_and_nothing_stored_are_one_line(copy, tmp_path, capsys):
    assert main(["verify", str(copy), "--seed", "3"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    empty = write_study(tmp_path / "empty")
    assert main(["verify", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no stored runs" in err


def test_clean_through_a_linked_study_file_touches_nothing(tmp_path, capsys, monkeypatch):
    target = write_study(tmp_path / "target")
    run_study(load_study(target), progress=False)
    write_study(target, TOY_STUDY.replace("seed = 7", "seed = 8"))  # its runs are now stale
    before = sorted(p.name for p in (target / "results" / "runs").iterdir())
    other = tmp_path / "other"
    other.mkdir()
    (other / "study.toml").symlink_to(target / "study.toml")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    assert main(["clean", str(other), "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a link" in err and "acts only on the folder named" in err
    assert sorted(p.name for p in (target / "results" / "runs").iterdir()) == before
    assert main(["clean", str(target), "--yes"]) == 0  # named itself, it is cleaned
    assert "removed 8 files" in capsys.readouterr().out


def test_verify_progress_in_a_log_is_a_few_plain_lines(copy, capsys):
    # stderr is not a terminal here: no bar redrawn frame by frame, a line at start and end
    capsys.readouterr()
    assert main(["verify", str(copy)]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    lines = [line for line in err.splitlines() if line.startswith("verify: ")]
    assert lines[0].startswith("verify: 0/4 runs") and lines[-1].startswith("verify: 4/4 runs")
    assert len(lines) <= 12
