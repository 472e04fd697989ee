"""The `desim` command: run, plot, validate and list.

    desim run STUDY [--quick] [--workers N]   run what is not done yet, write results and figures
              [--scheduler ADDRESS|local:N]   ... with the runs computed on a dask cluster
    desim plot STUDY [--quick]                redraw figures from results/
    desim validate STUDY [--quick]            check the study file, run nothing
              [--memory SIZE] [--force]       ... (and run:) memory one run may use; no estimates
    desim summary STUDY [--target X] [--at T] a metric per scenario and grid point, as a table
              [--recover T [--within F]]      ... and the time to recover from a change at T
    desim verify STUDY [--sample N [--seed S]] check stored files, re-run runs, name changes
    desim clean STUDY [--yes]                 remove results of older versions of the study file
    desim export STUDY --format csv|parquet|netcdf [--out F]   current results for other tools
    desim list                                every registered name and its parameters
    desim --version

STUDY is a study folder, a study file, or a suite (a folder of study folders: the command acts
on each in order). A bad study file or argument prints one line ``desim: error: ...`` and
exits with status 2, before anything is written; so does trouble with the file system.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np

import desim
from desim.kernel.params import ConfigError, describe
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import (
    AVAILABILITY,
    CURVES,
    DATA,
    DISTRIBUTIONS,
    LINKS,
    METRICS,
    PROTOCOLS,
    TOPOLOGIES,
    Registry,
)
from desim.study.spec import Study, check_setups, find_studies, load_study
from desim.study.spec.limits import parse_size

#: Exit status: success, failed runs, bad input, interrupted (as a shell reports Ctrl-C).
EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Stop(Exception):
    """Stop the command with an exit status (its message is already printed)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _workers(text: str) -> int:
    # digits only: int() would also take " 2", "+2", "2_0" and other scripts' digits
    n = int(text) if text.isascii() and text.isdecimal() else 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer ≥ 1")
    return n


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other desim error."""

    def error(self, message: str) -> NoReturn:
        print(f"desim: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)


def _parser() -> argparse.ArgumentParser:
    """The desim command line: one sub-command per verb, each with its own options."""
    parser = _Parser(
        prog="desim",
        description="Discrete-event simulator for private collaborative estimation.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    parser.add_argument("--version", action="version", version=f"desim {desim.__version__}")
    run = _add_run(sub)
    _study_command(sub, "plot", "redraw a study's figures from its results").set_defaults(
        func=_plot
    )
    validate = _study_command(sub, "validate", "check a study file without running it")
    validate.set_defaults(func=_validate)
    for p in (run, validate):
        p.add_argument(
            "--force",
            action="store_true",
            help="accept a study larger than this machine can run (run count, work, memory)",
        )
        p.add_argument(
            "--memory",
            type=_size,
            metavar="SIZE",
            help="memory one run may use, e.g. 2G or 512M (default: what this machine has "
            "available); a run estimated above it is refused before anything runs",
        )
    _add_summary(sub)
    _add_verify(sub)
    clean = _study_command(
        sub,
        "clean",
        "remove stored results of older versions of the study file (and damaged records set aside)",
    )
    clean.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    clean.set_defaults(func=_clean)
    _add_export(sub)
    sub.add_parser(
        "list",
        help="list protocols, data models, link models and curves",
        description="list protocols, data models, link models and curves",
    ).set_defaults(func=_list)
    return parser


def _study_command(sub, name: str, help_text: str) -> argparse.ArgumentParser:
    """A sub-command acting on a study: STUDY and --quick."""
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("study", metavar="STUDY", help="study folder or its study.toml")
    p.add_argument(
        "--quick",
        action="store_true",
        help="seconds-long smoke version ([quick] table), written under quick/",
    )
    return p


def _add_run(sub) -> argparse.ArgumentParser:
    """`desim run`: workers, a dask scheduler, progress."""
    run = _study_command(sub, "run", "run a study (resuming what is done) and draw its figures")
    run.add_argument(
        "--workers",
        type=_workers,
        metavar="N",
        help="worker processes (default 1: run in this process; not with --scheduler)",
    )
    run.add_argument(
        "--scheduler",
        metavar="ADDRESS|local:N",
        help="run on a dask.distributed cluster: a scheduler's address, or local:N "
        "to start N worker processes here (needs `pip install 'desim[dask]'`)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=_run)
    return run


def _add_summary(sub) -> None:
    """`desim summary`: a metric at a slot, and the time to reach a target."""
    summary = _study_command(
        sub,
        "summary",
        "print a metric per grid point and scenario: mean ± SE at a slot, and the "
        "time to reach a target",
    )
    summary.add_argument("--metric", default="mse", help="the metric (default mse)")
    summary.add_argument(
        "--at", type=float, metavar="T", help="the slot (default: each run's last checkpoint)"
    )
    summary.add_argument(
        "--target",
        type=_positive,
        metavar="X",
        help="also the time at which the metric first reaches X",
    )
    summary.add_argument(
        "--recover",
        type=_positive,
        metavar="T",
        help="also the value before slot T and the time from T until the metric is back within "
        "--within times it (e.g. after a class switch at T)",
    )
    summary.add_argument(
        "--within",
        type=_positive,
        default=2.0,
        metavar="F",
        help="the factor of --recover (default 2)",
    )
    summary.add_argument("--csv", type=Path, metavar="FILE", help="also write the table here")
    summary.set_defaults(func=_summary)


def _add_verify(sub) -> None:
    """`desim verify`: check stored files, re-run stored runs (all or a sample)."""
    verify = _study_command(
        sub,
        "verify",
        "check every stored record against its checksum, then re-run stored runs and "
        "report any whose trajectory changed (after upgrading desim)",
    )
    verify.add_argument(
        "--sample",
        type=_natural,
        metavar="N",
        help="re-run N stored runs drawn at random, a new draw each time (default: all; "
        "0: check the stored files only)",
    )
    verify.add_argument(
        "--seed",
        type=_natural,
        metavar="S",
        help="draw the sample with this seed (verify prints the seed of each draw)",
    )
    verify.add_argument("--no-progress", action="store_true", help="no progress bar")
    verify.set_defaults(func=_verify)


def _add_export(sub) -> None:
    """`desim export`: the results as csv, parquet or netCDF."""
    export = _study_command(
        sub, "export", "write a study's current results as csv, parquet or netCDF (curves beside)"
    )
    export.add_argument(
        "--format",
        required=True,
        choices=["csv", "parquet", "netcdf"],
        help="csv and parquet: tidy tables (curves in <F>.curves.<ext>); "
        "netcdf: one xarray Dataset",
    )
    export.add_argument(
        "--out",
        type=Path,
        metavar="F",
        help="the file to write (default: beside the results folder)",
    )
    export.set_defaults(func=_export)


def _natural(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer ≥ 0")
    return n


def _positive(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number > 0")
    return x


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _where(path: Path) -> str:
    """`path` relative to the working directory when it is below it (shorter to read)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    minutes, sec = divmod(round(s), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{sec:02d}s" if hours else f"{minutes}m{sec:02d}s"


def _studies(args: argparse.Namespace) -> list[Study]:
    """The study (or every sub-study of the suite) STUDY names, all validated before any of
    them is acted on: a bad sub-study stops a suite before anything runs."""
    force, memory = getattr(args, "force", False), getattr(args, "memory", None)
    return [
        load_study(file, quick=args.quick, force=force, memory=memory)
        for file in find_studies(args.study)
    ]


def _each(args: argparse.Namespace, act, studies: list[Study] | None = None) -> int:
    """Call `act(study)` on the study (or every sub-study of the suite) STUDY names; return
    the worst exit status. A suite prints a heading before each sub-study."""
    studies = _studies(args) if studies is None else studies
    worst = EXIT_OK
    for study in studies:
        if len(studies) > 1:
            print(f"== {_where(study.file.parent)}", flush=True)
        worst = max(worst, act(study))
    if len(studies) > 1:
        word = {EXIT_OK: "ok", EXIT_FAILED: "some runs failed"}.get(worst, "stopped")
        print(f"desim: suite {_where(Path(args.study))}: {len(studies)} studies: {word}")
    return worst


def _notes(notes: list[str]) -> None:
    for note in notes:
        print(f"desim: note: {note}", file=sys.stderr)


def _files_only() -> None:
    """Draw into files only (no display needed): the CLI's backend, chosen before pyplot is
    used; importing desim itself never chooses one."""
    import matplotlib

    matplotlib.use("Agg")


def _run(args: argparse.Namespace) -> int:
    """`desim run`: run every study STUDY names (one progress bar for a suite), then draw."""
    _files_only()
    if args.scheduler is not None:
        from desim.study.dask import parse_scheduler

        parse_scheduler(args.scheduler)  # before anything runs
        if args.workers is not None:  # the cluster's workers compute: --workers would be ignored
            raise ConfigError(
                f"--workers {args.workers} with --scheduler {args.scheduler}: give one of them "
                "(local:N starts N worker processes here)"
            )
    args.workers = args.workers or 1

    studies = _studies(args)
    for study in studies:
        check_setups(study)
    progress = _suite_progress(args, studies)
    try:
        return _each(args, lambda study: _run_one(args, study, progress), studies)
    finally:
        if not isinstance(progress, bool):
            progress.close()


def _suite_progress(args: argparse.Namespace, studies: list[Study]):
    """Whether to show progress; a suite has one progress bar over all its sub-studies' runs."""
    progress = not args.no_progress
    if progress and len(studies) > 1:
        from desim.study.progress import progress_bar

        total = sum(len(s.unique_runs) for s in studies)
        progress = progress_bar(total, f"suite {_where(Path(args.study))}"[:40], "run")
    return progress


def _run_one(args: argparse.Namespace, study: Study, progress) -> int:
    """Run one study, draw its figures and report what happened."""
    from desim.study.plots import draw_figures  # matplotlib is slow to import
    from desim.study.results import run_study

    try:
        on = {} if args.scheduler is None else {"scheduler": args.scheduler}
        summary = run_study(study, workers=args.workers, progress=progress, **on)
    except KeyboardInterrupt:
        print(
            f"desim: interrupted; finished runs are kept in "
            f"{_where(study.results_dir)}; run the same command again to resume",
            file=sys.stderr,
        )
        raise _Stop(EXIT_INTERRUPTED) from None
    for name in summary.damaged:
        print(
            f"desim: note: {name}: damaged record (checksum differs), set aside and run again",
            file=sys.stderr,
        )
    for warning in summary.warnings:
        print(f"desim: warning: {warning}", file=sys.stderr)
    has_results = summary.done + summary.skipped or study.curve_jobs
    figures = draw_figures(study) if has_results else []
    _report_run(args, study, summary, figures)
    return _report_failures(summary)


def _report_run(args: argparse.Namespace, study: Study, summary, figures: list[Path]) -> None:
    """The lines `desim run` prints about a study: runs, results, stale runs, figures."""
    workers = f"{args.workers} worker{'s' if args.workers > 1 else ''}"
    if args.scheduler is not None:
        workers = f"dask scheduler {args.scheduler}"
    dedup = len(study.runs) - len(study.unique_runs)
    shared = f" ({dedup} shown at other grid points)" if dedup else ""
    done = f"{summary.done} done"
    if summary.shared:  # runs written from an identical run's trajectory (desim.study.sharing)
        done += f" ({summary.done - summary.shared} computed, {summary.shared} shared with an "
        done += "identical run)"
    print(
        f"desim: {study.title}: {len(study.unique_runs)} runs{shared}: {done}, "
        f"{summary.skipped} skipped (already done), {summary.failed} failed "
        f"in {_seconds(summary.wall_seconds)} with {workers}"
    )
    print(f"results: {_where(summary.results_dir)}")
    if summary.stale:
        print(
            f"desim: note: {summary.stale} stored runs of an older version of "
            f"{study.file.name} are kept (not shown); `{study.command('clean')}` "
            "removes them",
            file=sys.stderr,
        )
    if figures:
        names = ", ".join(f.name for f in figures)
        print(f"figures: {_where(study.figures_dir)} ({names})")


def _report_failures(summary) -> int:
    """Print the first failures of a run (the manifest has them all); the exit status."""
    shown = 10  # the manifest has them all; a terminal needs only the first few
    for what, error in summary.failures[:shown]:
        print(f"desim: failed: {what}: {error}", file=sys.stderr)
    if summary.failures:
        more = len(summary.failures) - shown
        extra = f" (first {shown} shown)" if more > 0 else ""
        print(
            f"desim: {len(summary.failures)} failures{extra}; errors and tracebacks are "
            f"in {_where(summary.results_dir / 'manifest.json')}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def _plot(args: argparse.Namespace) -> int:
    _files_only()
    from desim.study.plots import draw_figures
    from desim.study.results import load_results

    def one(study: Study) -> int:
        loaded = load_results(study)
        _notes(loaded.notes)
        for path in draw_figures(study, loaded):
            print(_where(path))
        return EXIT_OK

    return _each(args, one)


def _count(study: Study) -> str:
    unique = len(study.unique_runs)
    dedup = len(study.runs) - unique
    shared = f" (and {dedup} shown at other grid points)" if dedup else ""
    return f"ok: {unique} runs{shared}, {len(study.curve_jobs)} curves"


def _validate(args: argparse.Namespace) -> int:
    def one(study: Study) -> int:
        check_setups(study)
        _notes(list(study.notes))
        print(_count(study))
        return EXIT_OK

    return _each(args, one)


def _summary(args: argparse.Namespace) -> int:
    from desim.study.results import load_agents, load_results
    from desim.study.summary import ledger_maxima, summarise_runs

    def one(study: Study) -> int:
        loaded = load_results(study)
        _notes(loaded.notes)
        metrics = loaded.metrics
        if metrics.empty:
            raise ConfigError(f"{_where(study.results_dir)}: no finished runs to summarise")
        known = sorted(metrics["metric"].unique())
        if args.metric not in known:
            raise ConfigError(
                f"--metric {args.metric!r}: not in the results; recorded: {', '.join(known)}"
            )
        if args.at is not None:
            slots = np.unique(metrics["t"].to_numpy(float))
            if args.at not in slots:
                shown = ", ".join(f"{t:g}" for t in slots[:60])
                more = " ..." if len(slots) > 60 else ""
                raise ConfigError(
                    f"--at {args.at:g}: no checkpoint at that slot; checkpoints: {shown}{more}"
                )
        # runs that kept the privacy ledger show the ε spent (max over agents) beside the metric
        table = summarise_runs(
            metrics,
            args.metric,
            list(study.grid_columns.values()),
            args.at,
            args.target,
            beside=ledger_maxima(metrics),
            agents=load_agents(study, loaded.state),
            recover=None if args.recover is None else (args.recover, args.within),
        )
        if args.csv is not None:
            table.to_csv(args.csv, index=False)
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        return EXIT_OK

    return _each(args, one)


def _verify(args: argparse.Namespace) -> int:
    """`desim verify`: name every damaged, missing, garbled or orphaned file and every changed
    run; exit 1 when anything is not identical."""
    import random

    from desim.study.verify import KINDS, verify_study

    if args.seed is not None and args.sample is None:
        raise ConfigError("--seed: draws a sample; give --sample N too")
    # one seed for the whole command (a suite's studies too), so that --seed repeats it
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)

    def one(study: Study) -> int:
        found = verify_study(study, args.sample, seed, progress=not args.no_progress)
        if found.seed is not None:
            print(
                f"desim: verify: {len(found.checked)} runs drawn with seed {found.seed} "
                f"(`--seed {found.seed}` draws them again)",
                file=sys.stderr,
            )
        _notes(found.notes)
        for kind, line in found.problems:
            print(f"desim: {kind}: {line}", file=sys.stderr)
        for _, line in found.changed:
            print(f"desim: changed: {line}", file=sys.stderr)
        for run_id, error in found.failed:
            print(f"desim: failed: {run_id}: {error}", file=sys.stderr)
        faults = ", ".join(f"{found.count(k)} {k}" for k in KINDS)
        same = len(found.checked) - len(found.changed) - len(found.failed)
        print(
            f"desim: {study.title}: {found.records} stored files checked: {faults}; "
            f"verified {len(found.checked)} runs: {same} identical, "
            f"{len(found.changed)} changed, {len(found.failed)} failed"
        )
        return EXIT_OK if found.ok else EXIT_FAILED

    return _each(args, one)


def _check_named(file: Path) -> None:
    """Refuse a study file that is a link: `clean` acts only on the study named, never on
    the one a link leads to (another folder's, whose results it would remove)."""
    if file.is_symlink() or file.resolve().parent != file.parent.resolve():
        raise ConfigError(
            f"{_where(file)}: is a link to another study file; desim clean acts only on the "
            "folder named (run it on the study the link leads to, if that is meant)"
        )


def _clean(args: argparse.Namespace) -> int:
    from desim.study.verify import clean_study, stale_files

    for file in find_studies(args.study):
        _check_named(file)

    def one(study: Study) -> int:
        files = stale_files(study)
        if not files:
            print(f"desim: {_where(study.results_dir)}: nothing to clean")
            return EXIT_OK
        if not args.yes:
            if not sys.stdin.isatty():
                raise ConfigError(
                    f"{_where(study.results_dir)}: {len(files)} files of older "
                    "versions; add --yes to remove them"
                )
            answer = input(
                f"remove {len(files)} files of older versions from "
                f"{_where(study.results_dir)}? [y/N] "
            )
            if answer.strip().lower() not in ("y", "yes"):
                print("desim: nothing removed")
                return EXIT_OK
        removed = clean_study(study)
        print(f"desim: removed {removed} files from {_where(study.results_dir)}")
        return EXIT_OK

    return _each(args, one)


def _export(args: argparse.Namespace) -> int:
    """`desim export`: write the current results; say how many runs they lack."""
    from desim.study.export import export, load

    files = find_studies(args.study)
    if len(files) > 1 and args.out is not None:
        raise ConfigError(
            f"--out {args.out}: STUDY is a suite of {len(files)} studies; "
            "export them one by one, or leave --out out"
        )
    for file in files:
        results = load(load_study(file, quick=args.quick))
        study = results.study
        counted = f"{results.runs_done} of {results.runs_total} runs"
        _notes([n for n in results.notes if not n.startswith(counted)])
        for path in export(results, args.format, args.out):
            print(_where(path))
        missing = results.runs_total - results.runs_done
        if missing:
            print(
                f"desim: warning: exported {counted}; {missing} missing — run "
                f"`{study.command('run')}` for all of them",
                file=sys.stderr,
            )
    return EXIT_OK


def _first_line(obj: object) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def _list_registry(title: str, registry: Registry) -> list[str]:
    lines = [f"{title}:"]
    for name, obj in registry.items():
        lines.append(f"  {name}  {_first_line(obj)}  [{obj.__module__}]")
        params = getattr(obj, "Params", obj)
        try:
            rows = describe(params)
        except TypeError:  # not a params dataclass: nothing to list
            rows = []
        for pname, ptype, default, doc in rows:
            lines.append(f"      {pname} ({ptype}, default {default!r}): {doc}")
    if len(lines) == 1:
        lines.append("  (none)")
    return lines


def _list(args: argparse.Namespace) -> int:
    plugins = load_plugins()
    lines = [f"plug-ins: {', '.join(f'{v} ({k})' for k, v in plugins.items()) or 'none'}", ""]
    for title, registry in (
        ("protocols", PROTOCOLS),
        ("data models", DATA),
        ("link models", LINKS),
        ("availability models ([network.outages], [network.nodes])", AVAILABILITY),
        ("distributions ([network.latency], stragglers' delay, churn sessions)", DISTRIBUTIONS),
        ("topologies", TOPOLOGIES),
        ("curves", CURVES),
        ("metrics", METRICS),
    ):
        lines += [*_list_registry(title, registry), ""]
    print("\n".join(lines).rstrip())
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `desim` command; returns the exit status."""
    try:
        parser = _parser()
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_CONFIG
        return args.func(args)
    except ConfigError as exc:  # several errors at once (ConfigErrors): one line each
        lines = str(exc).splitlines() if hasattr(exc, "messages") else [str(exc)]
        for line in lines:
            print(f"desim: error: {' '.join(line.split())}", file=sys.stderr)
        return EXIT_CONFIG
    except _Stop as stop:
        return stop.code
    except KeyboardInterrupt:  # e.g. while drawing; results are already safe on disk
        print("desim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `desim summary ... | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush is silent
        return EXIT_OK
    except OSError as exc:  # the file system: read-only, full, a file where a folder goes
        where = f"{_where(Path(exc.filename))}: " if exc.filename else ""
        reason = exc.strerror or str(exc) or type(exc).__name__
        print(f"desim: error: {where}{reason}; nothing already stored was lost", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
