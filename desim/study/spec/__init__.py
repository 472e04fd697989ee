"""Study files: one TOML file that says what to run, how often, over which grid, and what to draw.

`load_study` reads ``study.toml``, validates every table (unknown keys, types, ranges, names of
protocols, data models, link models, topologies, curves and metrics, references between tables)
and expands the study into its runs, before anything is run or written: a bad file stops with one
`ConfigError` line that names the field, the value and what is allowed.

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
hashes results are keyed by). `load_study` runs them in that order.
"""

from __future__ import annotations

from pathlib import Path

from desim.kernel.params import ConfigError
from desim.study.spec.expand import expand_curves, expand_runs, grid_points
from desim.study.spec.figures import final_plots, study_agents, study_title
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
    check_input_file,
    find_studies,
    find_study_file,
    parse_study,
    read_study_file,
)
from desim.study.spec.validate import check_setups, labels, study_checks, validate_study

__all__ = [
    "LEDGER_PREFIX",
    "STUDY_FILE",
    "CurveJob",
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


def load_study(path: str | Path, quick: bool = False, force: bool = False) -> Study:
    """Read, validate and expand the study at `path` (folder or study.toml).

    [defaults] reach every scenario and curve that declares the key (their own keys win).
    With `quick`, the [quick] table (or `QUICK_FALLBACK`) overrides replicates, t_max,
    data.agents and checkpoints (a [grid] on data.agents still wins), and outputs go under
    ``<study>/quick/``. Raises `ConfigError` with one line naming the file, the field, the
    value and what is allowed. A study larger than one machine can run (run count, work,
    memory: `desim.study.spec.limits.check_size`) is refused unless `force`.
    """
    file = find_study_file(path)
    raw = read_study_file(file)
    try:
        return build_study(raw, file.resolve(), quick, force)
    except ConfigError as exc:
        message = " ".join(str(exc).split("\n"))
        raise ConfigError(f"{file}: {message}") from None


def build_study(raw: dict, file: Path, quick: bool = False, force: bool = False) -> Study:
    """The study a study file read as `raw` from `file` describes: parsed, validated, checked
    for size (unless `force`) and expanded; errors are not yet prefixed with the file."""
    doc = parse_study(raw, file)
    h = horizon(doc, quick)
    v = validate_study(doc)
    notes = study_checks(doc, v)
    if not force:  # before the grid is expanded: a grid of 10⁹ points is refused, not built
        check_size(h, doc.grid, len(v.scenarios))
        check_memory(h, doc, v.scenarios, v.curves)
    points = grid_points(doc.grid, v.grid_columns)
    runs = expand_runs(doc, h, v, points)
    jobs = expand_curves(doc, h, v, points)
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
