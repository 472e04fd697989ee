"""The `desim` command: run, plot, validate and list.

    desim run STUDY [--quick] [--workers N]   run what is not done yet, write results and figures
    desim plot STUDY [--quick]                redraw figures from results/
    desim validate STUDY [--quick]            check the study file, run nothing
    desim summary STUDY [--target X] [--at T] a metric per scenario and grid point, as a table
    desim list                                every registered name and its parameters

STUDY is a study folder or its study.toml. A bad study file or argument prints one line
``desim: error: ...`` and exits with status 2, before anything is written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

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
from desim.study.spec import Study, load_study

#: Exit status: success, failed runs, bad input, interrupted (as a shell reports Ctrl-C).
EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130


def _workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer ≥ 1")
    return n


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other desim error."""

    def error(self, message: str) -> NoReturn:
        print(f"desim: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="desim",
        description="Discrete-event simulator for private collaborative estimation.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def study_command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("study", metavar="STUDY", help="study folder or its study.toml")
        p.add_argument("--quick", action="store_true",
                       help="seconds-long smoke version ([quick] table), written under quick/")
        return p

    run = study_command("run", "run a study (resuming what is done) and draw its figures")
    run.add_argument("--workers", type=_workers, default=1, metavar="N",
                     help="worker processes (default 1: run in this process)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=_run)
    study_command("plot", "redraw a study's figures from its results").set_defaults(func=_plot)
    study_command("validate", "check a study file without running it").set_defaults(
        func=_validate
    )
    summary = study_command(
        "summary", "print a metric per grid point and scenario: mean ± SE at a slot, and the "
        "time to reach a target")
    summary.add_argument("--metric", default="mse", help="the metric (default mse)")
    summary.add_argument("--at", type=float, metavar="T",
                         help="the slot (default: each run's last checkpoint)")
    summary.add_argument("--target", type=_positive, metavar="X",
                         help="also the time at which the metric first reaches X")
    summary.add_argument("--csv", type=Path, metavar="FILE", help="also write the table here")
    summary.set_defaults(func=_summary)
    sub.add_parser("list", help="list protocols, data models, link models and curves",
                   description="list protocols, data models, link models and curves"
                   ).set_defaults(func=_list)
    return parser


def _positive(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number > 0")
    return x


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


def _run(args: argparse.Namespace) -> int:
    from desim.study.plots import (
        draw_figures,  # matplotlib is slow to import; only `run`/`plot` need it
    )
    from desim.study.results import run_study

    study = load_study(args.study, quick=args.quick)
    try:
        summary = run_study(study, workers=args.workers, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"desim: interrupted; finished runs are kept in {_where(study.results_dir)}; "
              "run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    figures = draw_figures(study) if summary.done + summary.skipped or study.curve_jobs else []
    workers = f"{args.workers} worker{'s' if args.workers > 1 else ''}"
    print(
        f"desim: {study.title}: {len(study.runs)} runs: {summary.done} done, "
        f"{summary.skipped} skipped (already done), {summary.failed} failed "
        f"in {_seconds(summary.wall_seconds)} with {workers}"
    )
    print(f"results: {_where(summary.results_dir)}")
    if figures:
        names = ", ".join(f.name for f in figures)
        print(f"figures: {_where(study.figures_dir)} ({names})")
    shown = 10  # the manifest has them all; a terminal needs only the first few
    for what, error in summary.failures[:shown]:
        print(f"desim: failed: {what}: {error}", file=sys.stderr)
    if summary.failures:
        more = len(summary.failures) - shown
        extra = f" (first {shown} shown)" if more > 0 else ""
        print(f"desim: {len(summary.failures)} failures{extra}; errors and tracebacks are in "
              f"{_where(summary.results_dir / 'manifest.json')}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _plot(args: argparse.Namespace) -> int:
    from desim.study.plots import draw_figures

    study = load_study(args.study, quick=args.quick)
    for path in draw_figures(study):
        print(_where(path))
    return EXIT_OK


def _count(study: Study) -> str:
    return f"ok: {len(study.runs)} runs, {len(study.curve_jobs)} curves"


def _validate(args: argparse.Namespace) -> int:
    print(_count(load_study(args.study, quick=args.quick)))
    return EXIT_OK


def _summary(args: argparse.Namespace) -> int:
    from desim.study.results import load_metrics
    from desim.study.summary import ledger_maxima, summarise_runs

    study = load_study(args.study, quick=args.quick)
    metrics = load_metrics(study)
    if metrics.empty:
        raise ConfigError(f"{_where(study.results_dir)}: no finished runs to summarise")
    known = sorted(metrics["metric"].unique())
    if args.metric not in known:
        raise ConfigError(f"--metric {args.metric!r}: not in the results; "
                          f"recorded: {', '.join(known)}")
    # runs that kept the privacy ledger show the ε spent (max over agents) beside the metric
    table = summarise_runs(metrics, args.metric, list(study.grid_columns.values()), args.at,
                           args.target, beside=ledger_maxima(metrics))
    if table.empty:
        raise ConfigError(f"--at {args.at:g}: no checkpoint at that slot")
    if args.csv is not None:
        table.to_csv(args.csv, index=False)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
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
        ("protocols", PROTOCOLS), ("data models", DATA), ("link models", LINKS),
        ("availability models ([network.outages], [network.nodes])", AVAILABILITY),
        ("distributions ([network.latency], stragglers' delay, churn sessions)",
         DISTRIBUTIONS),
        ("topologies", TOPOLOGIES), ("curves", CURVES), ("metrics", METRICS),
    ):
        lines += [*_list_registry(title, registry), ""]
    print("\n".join(lines).rstrip())
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `desim` command; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_CONFIG
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"desim: error: {' '.join(str(exc).splitlines())}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:  # e.g. while drawing; results are already safe on disk
        print("desim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
