"""Study files: one TOML file that says what to run, how often, over which grid, and what to draw.

`load_study` reads ``study.toml``, validates every table (unknown keys, types, ranges, names of
protocols, data models, link models, topologies, curves and metrics, references between tables)
and expands the study into its runs, before anything is run or written: a bad file stops with
every error found (`ConfigErrors`, at most `MAX_SHOWN` shown), each one line that names the
field, the value and what is allowed, with paths inside the study folder relative to it.

A run is one (grid point, scenario, replicate): a `desim.study.scenario.Scenario` with a
stable, readable id and a config hash, which is what lets `desim run` resume where it stopped.
The config hash covers the scenario and the grid values that reach it: a scenario whose
parameters do not include a swept key is the same run at every value of that key, runs once
and is shown at every grid point (curves likewise).

A study file reads only files inside its own folder (a study file may be shared and run by
someone else), and a folder without a study.toml whose sub-folders hold study files is a
*suite* (`find_studies`).

The file goes through four stages, each a module that can be used and tested alone:
`parse` (the TOML read into a `StudyDocument`, each table checked on its own), `validate`
(tables checked against each other and the registries, [[plot]] tables in `figures`;
`limits` refuses a study too large
before anything is built), `expand` (grid points, runs, curve jobs) and `hashing` (the config
hashes results are keyed by). `load_study` runs them in that order; within a stage, independent
checks (each table, scenario, curve, plot, grid path, file) each report their error
(`desim.study.spec.errors`).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from desim.kernel.params import ConfigError, unknown_key_message
from desim.study.spec.errors import (
    MAX_SHOWN,
    ConfigErrors,
    Errors,
    messages_of,
    relative_to_folder,
    shown_path,
    with_file,
)
from desim.study.spec.expand import expand_curves, expand_runs, graph_match_notes, grid_points
from desim.study.spec.figures import final_plots, plot_specs, study_agents, study_title
from desim.study.spec.hashing import canonical_hash, study_hash
from desim.study.spec.limits import check_memory, check_size, horizon
from desim.study.spec.model import (
    LEDGER_PREFIX,
    STUDY_FILE,
    CurveJob,
    CurveSpec,
    GridPoint,
    PlotSpec,
    Run,
    ScenarioSpec,
    Study,
    default_scale,
    slug,
)
from desim.study.spec.parse import (
    StudyDocument,
    check_input_file,
    find_studies,
    find_study_file,
    parse_study,
    read_study_file,
)
from desim.study.spec.validate import (
    Validated,
    declared_defaults,
    grid_columns,
    labels,
    study_checks,
    validate_study,
)
from desim.study.spec.validate import check_setups as _check_setups

__all__ = [
    "LEDGER_PREFIX",
    "MAX_SHOWN",
    "STUDY_FILE",
    "CurveJob",
    "ConfigErrors",
    "CurveSpec",
    "GridPoint",
    "PlotSpec",
    "Run",
    "ScenarioSpec",
    "Study",
    "canonical_hash",
    "check_input_file",
    "check_setups",
    "default_scale",
    "find_studies",
    "find_study_file",
    "load_study",
    "slug",
]


def load_study(
    path: str | Path, quick: bool = False, force: bool = False, memory: int | None = None
) -> Study:
    """Read, validate and expand the study at `path` (folder or study.toml).

    [defaults] reach every scenario and curve that declares the key (their own keys win).
    With `quick`, the [quick] table (or `QUICK_FALLBACK`) overrides replicates, t_max,
    data.agents and checkpoints (a [grid] on data.agents still wins), and outputs go under
    ``<study>/quick/``. Raises `ConfigErrors` (a `ConfigError`) with every error found, each
    one line naming the file, the field, the value and what is allowed, paths inside the
    study folder relative to it. A study larger than one machine can run (run count, work,
    memory: `desim.study.spec.limits.check_size`) is refused unless `force`; `memory` caps
    the bytes one run may use below what this machine has available (`--memory`).
    """
    file = find_study_file(path)
    raw = read_study_file(file)
    try:
        return build_study(raw, file.resolve(), quick, force, memory)
    except ConfigError as exc:
        raise with_file(exc, str(file), file.resolve().parent) from None


def _add_curve_errors(errors: Errors, curve_errors: Errors) -> None:
    """The curves' errors after the runs': a bad [defaults] value is said once, not per user."""
    said = {_fault(m) for m in errors.messages}
    for message in curve_errors.messages:
        if _fault(message) + _DEFAULTS not in said:
            errors.add(message)


def _quick_hint(message: str, t_max: int) -> str:
    """A fault about the horizon, under --quick, says that the quick horizon caused it and where
    to change it (a switch at slot 2000 is no fault of a study of 10⁴ slots)."""
    if f"beyond t_max = {t_max}" not in message:
        return message
    return f"{message}; --quick runs t_max = {t_max}: set a larger t_max in [quick]"


def build_study(
    raw: dict, file: Path, quick: bool = False, force: bool = False, memory: int | None = None
) -> Study:
    """The study a study file read as `raw` from `file` describes: parsed, validated, checked
    for size (unless `force`) and expanded; errors are not yet prefixed with the file.

    Each stage reports every independent error it finds (`ConfigErrors`); a stage runs only
    when what it builds on passed ([[plot]] tables are not built on: their errors are
    reported with the expansion's).
    """
    doc = parse_study(raw, file)
    h = horizon(doc, quick)
    errors = Errors()
    v = validate_each(doc, errors)
    if v is None:
        errors.raise_any()
    notes: list[str] = []
    if not errors:  # the study-wide checks build on valid tables; their failure stops here
        checked = errors.attempt(study_checks, doc, v)
        if checked is None:
            errors.raise_any()
        notes = list(checked)
    # before the grid is expanded: a grid of 10⁹ points is refused, not built
    if not force and not (
        errors.passes(check_size, h, doc.grid, len(v.scenarios), memory, file.parent)
        and errors.passes(check_memory, h, doc, v.scenarios, v.curves, memory)
    ):
        errors.raise_any()
    points = grid_points(doc.grid, v.grid_columns)
    runs = errors.attempt(expand_runs, doc, h, v, points)
    curve_errors = Errors()
    jobs = curve_errors.attempt(expand_curves, doc, h, v, points)
    _add_curve_errors(errors, curve_errors)
    if quick:
        errors.messages = [_quick_hint(m, h.t_max) for m in errors.messages]
    errors.raise_any()
    notes += graph_match_notes(runs)  # agents and graph nodes a graph file leaves unmatched
    return Study(
        file=file,
        title=study_title(doc, h),
        seed=doc.settings.seed,
        replicates=h.replicates,
        t_max=h.t_max,
        checkpoints=h.checkpoints,
        per_agent=doc.settings.per_agent,
        quick=quick,
        scenarios=tuple(v.scenarios),
        curves=tuple(v.curves),
        plots=tuple(final_plots(v.plots, v.scenarios, doc, h)),
        grid_columns=v.grid_columns,
        points=tuple(points),
        runs=tuple(runs),
        curve_jobs=tuple(jobs),
        config_hash=study_hash(doc.raw, h.replicates, h.t_max, h.checkpoints, h.data),
        agents=study_agents(h.data),
        labels=labels(v),
        notes=tuple(notes),
    )


#: What a message about a value a scenario took from [defaults] ends with.
_DEFAULTS = " (set in [defaults])"


def _fault(message: str) -> str:
    """`message` without the scenario or curve it was found in (the fault itself)."""
    return re.sub(r"(?:scenario|curve) (?:'[^']*'|\"[^\"]*\"): ", "", message, count=1)


def validate_each(doc: StudyDocument, errors: Errors) -> Validated | None:
    """`validate_study` of `doc`, with the errors of its independent parts kept in `errors`;
    None when the runs cannot be expanded.

    The scenarios and curves are validated first (without [defaults], [grid] and [[plot]]);
    then each [defaults] key, each grid path and each [[plot]] is checked on its own against
    them; then the whole document goes through `validate_study`, whose checks across parts
    (grid columns against each other, plots sharing a file, ...) need every part sound. With
    only [[plot]] errors, the study without its plots is returned, to be expanded.
    """
    # alone, the scenarios are checked without their `where` (it names the grid's values)
    scenarios = [
        {k: v for k, v in t.items() if k != "where"} if isinstance(t, dict) else t
        for t in doc.scenarios
    ]
    core = errors.attempt(
        validate_study,
        dataclasses.replace(doc, defaults={}, grid={}, plots=[], scenarios=scenarios),
    )
    if core is None:
        return None
    known = declared_defaults(core.scenarios, core.curves)
    for key in doc.defaults:
        if key not in known:
            errors.add(unknown_key_message("[defaults]", key, sorted(known)))
    for path, values in doc.grid.items():
        with errors.check():
            grid_columns(
                {path: values}, core.data_cls, core.link_cls, core.topo_cls, known, doc.network
            )
    expandable = not errors
    # a plot's x may name any grid column, also one whose path was wrong: that is said once
    columns = [path.rpartition(".")[2] for path in doc.grid]
    for n, table in enumerate(doc.plots, start=1):
        with errors.check():
            try:
                plot_specs([table], core.scenarios, core.curves, doc.settings.title, columns)
            except ConfigError as exc:  # alone, the plot is #1; say which it is
                raise ConfigErrors(
                    re.sub(r"^plot #1\b", f"plot #{n}", m) for m in messages_of(exc)
                ) from None
    if not expandable:
        return None
    return errors.attempt(validate_study, dataclasses.replace(doc, plots=[]) if errors else doc)


def check_setups(study: Study) -> None:
    """Build each distinct set-up of the study's runs as a run would, before any run
    (`desim.study.spec.validate.check_setups`); errors name the study file as shown from the
    current directory and paths inside the study folder relative to it."""
    try:
        _check_setups(study)
    except ConfigError as exc:
        prefix = f"{study.file}: "
        raise ConfigErrors(
            f"{shown_path(study.file)}: {relative_to_folder(m.removeprefix(prefix), study.folder)}"
            for m in messages_of(exc)
        ) from None
