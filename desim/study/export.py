"""A study's results for notebooks and other tools: `load` and `export`.

`load(STUDY)` returns the results of the study file's *current* configuration (the same rows
`desim plot` and `desim summary` see, through `load_results`): a tidy metrics table with
columns ``scenario, replicate, <grid columns...>, t, metric, value`` and, alongside, the
closed-form curves ``curve, <grid columns...>, t, metric, value, stderr``. `Results.to_xarray`
turns both into one `xarray.Dataset`:

- ``value`` with dimensions (scenario, <grid columns...>, replicate, t, metric): NaN where a
  scenario has no run (e.g. a run that failed, or a metric only some protocols record);
- ``curve_value`` and ``curve_stderr`` with dimensions (curve, <grid columns...>, t), on the
  same ``t`` coordinate (the checkpoints of the study).

`export` writes them as csv, parquet or netCDF (``desim export``). xarray is an optional
dependency (``pip install 'desim[xarray]'``), needed only for `to_xarray` and netCDF.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from desim.kernel.params import ConfigError
from desim.study.results import load_results
from desim.study.spec import Study, load_study
from desim.study.store import atomic_write, write_parquet

if TYPE_CHECKING:
    import xarray as xr

#: Formats of `export` and the suffix of the file each writes by default.
FORMATS = {"csv": ".csv", "parquet": ".parquet", "netcdf": ".nc"}


def _xarray():
    try:
        import xarray
    except ImportError:
        raise ConfigError(
            "xarray is not installed; install it with `pip install 'desim[xarray]'`"
        ) from None
    return xarray


@dataclass
class Results:
    """The current results of a study: `metrics` (tidy, one row per run, slot and metric),
    `curves` (tidy, or None when the study has none), `notes` for the user (runs not
    done yet, stored runs of older versions that are not shown), and how many of the study's
    runs have results (`runs_done` of `runs_total`)."""

    study: Study
    metrics: pd.DataFrame
    curves: pd.DataFrame | None
    notes: list[str] = field(default_factory=list)
    runs_done: int = 0
    runs_total: int = 0

    @property
    def grid(self) -> list[str]:
        """The grid columns of the study (parameters swept by its ``[grid]``), in order."""
        return list(self.study.grid_columns.values())

    def __repr__(self) -> str:
        runs = (
            len(self.metrics.groupby(["scenario", *self.grid, "replicate"], sort=False))
            if not self.metrics.empty
            else 0
        )
        curves = 0 if self.curves is None else self.curves["curve"].nunique()
        return (
            f"<desim results of {self.study.title!r}: {runs} runs, "
            f"{len(self.metrics)} metric rows, {curves} curves>"
        )

    def plot(self, which: str | int = 0, ax=None):
        """The matplotlib Figure of the study's [[plot]] `which` (file name, stem or index),
        the same drawing `desim plot` writes to its file; into `ax` for a one-panel plot."""
        from desim.study.plots import figure

        return figure(self.study, which, self.metrics, self.curves, ax=ax)

    def to_xarray(self) -> xr.Dataset:
        """One Dataset: ``value`` over (scenario, grid columns…, replicate, t, metric) and
        ``curve_value``, ``curve_stderr`` over (curve, grid columns…, t); attributes name the
        study, its config hash and root seed."""
        xarray = _xarray()
        grid = self.grid
        dims = ["scenario", *grid, "replicate", "t", "metric"]
        parts = []
        if not self.metrics.empty:
            value = self.metrics.set_index(dims)["value"].to_xarray()
            order = [
                s.name for s in self.study.scenarios if s.name in set(self.metrics["scenario"])
            ]
            parts.append(value.reindex(scenario=order).to_dataset(name="value"))
        if self.curves is not None and not self.curves.empty:
            # the curves are all MSE curves; metric is kept as an attribute, not a dimension
            frame = self.curves.set_index(["curve", *grid, "t"])[["value", "stderr"]]
            curves = frame.rename(
                columns={"value": "curve_value", "stderr": "curve_stderr"}
            ).to_xarray()
            order = [c.name for c in self.study.curves if c.name in set(self.curves["curve"])]
            curves = curves.reindex(curve=order)
            curves["curve_value"].attrs["metric"] = "mse"
            parts.append(curves)
        ds = xarray.merge(parts, join="outer") if parts else xarray.Dataset()
        ds.attrs.update(
            title=self.study.title,
            study_file=self.study.file.name,
            config_hash=self.study.config_hash,
            root_seed=int(self.study.seed),
            quick=int(self.study.quick),
        )
        return ds


def load(study: str | Path | Study, quick: bool = False) -> Results:
    """The current results of `study` (a study folder, a study file, or a loaded `Study`).

    Only results of the study file as it is now are returned (records of older versions are
    counted in `notes`, never shown). Raises `ConfigError` when there are none yet.
    """
    if not isinstance(study, Study):
        study = load_study(study, quick=quick)
    loaded = load_results(study)
    return Results(
        study,
        loaded.metrics,
        loaded.curves,
        list(loaded.notes),
        runs_done=len(loaded.state.sidecars),
        runs_total=len(study.unique_runs),
    )


def _plain_strings(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with string columns as plain object columns (portable parquet and csv)."""
    out = frame.copy()
    for col in out.columns:
        if not (pd.api.types.is_numeric_dtype(out[col]) or pd.api.types.is_bool_dtype(out[col])):
            out[col] = out[col].astype(object)
    return out


def default_out(study: Study, fmt: str) -> Path:
    """Where `export` writes by default: beside the results folder, named after it
    (``results.csv``, ``quick/results.nc``...)."""
    return study.results_dir.with_name(study.results_dir.name + FORMATS[fmt])


def curves_path(out: Path) -> Path:
    """The curves file written beside `out` by the csv and parquet formats."""
    return out.with_name(f"{out.stem}.curves{out.suffix}")


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _protected_folders(study: Study) -> list[Path]:
    """The results and figures folders of the study file, for full and quick runs."""
    folder = study.folder.resolve()
    names = (study.results_dir.name, study.figures_dir.name)
    return [root / name for root in (folder, folder / "quick") for name in names]


def check_target(study: Study, target: Path, shown: str) -> None:
    """Refuse to write an export to `target` (named to the user as `shown`) when it would
    replace what the study holds: a file inside its results or figures folders, the study
    file, or any existing file of the study folder (compared after following links).

    Earlier exports to the default place (`default_out`) may be replaced.
    """
    real = target.resolve()
    folder = study.folder.resolve()
    if real == study.file.resolve():
        raise ConfigError(f"--out {shown}: is the study file; give a file outside the study")
    for protected in _protected_folders(study):
        if _inside(real, protected):
            raise ConfigError(
                f"--out {shown}: is inside the study's {protected.relative_to(folder)}/ "
                "folder, which only desim run writes; give a file elsewhere"
            )
    defaults = [default_out(study, f) for f in FORMATS]
    ours = {p.resolve() for d in defaults for p in (d, curves_path(d))}
    if _inside(real, folder) and (real.exists() or real.is_symlink()) and real not in ours:
        raise ConfigError(
            f"--out {shown}: is an existing file of the study folder "
            f"({real.relative_to(folder)}); export never replaces a study's files; "
            "give a new name"
        )


def export(
    study: str | Path | Study | Results,
    fmt: str,
    out: str | Path | None = None,
    quick: bool = False,
) -> list[Path]:
    """Write the current results of `study` (or `Results` already loaded) as `fmt` (csv,
    parquet or netcdf) to `out` (default `default_out`); return the files written.

    csv and parquet write the tidy metrics table to `out` and the curves (if any) to
    ``<out stem>.curves.<suffix>`` beside it; netcdf writes `Results.to_xarray` to one file.
    Floats are written exactly (csv with round-trip precision). Files are written atomically.
    A target inside the study's results or figures folders, the study file or another
    existing file of the study folder is refused (`check_target`): an export never destroys.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}")
    results = study if isinstance(study, Results) else load(study, quick=quick)
    target = Path(out) if out is not None else default_out(results.study, fmt)
    if target.is_dir():
        raise ConfigError(f"--out {target}: is a folder; give a file name")
    if not target.parent.is_dir():
        raise ConfigError(f"--out {target}: folder {target.parent} does not exist")
    tables: list[tuple[Path, pd.DataFrame]] = [(target, results.metrics)]
    if results.curves is not None and fmt != "netcdf":
        tables.append((curves_path(target), results.curves))
    for path, _ in tables:
        shown = str(target) if path == target else f"{target} (its curves file {path.name})"
        check_target(results.study, path, shown)
    if fmt == "netcdf":
        ds = results.to_xarray()
        data = ds.to_netcdf()  # bytes (netCDF3 through scipy when no netCDF4 library)
        atomic_write(target, lambda tmp: Path(tmp).write_bytes(bytes(data)), links_ok=True)
        return [target]
    written = []
    for path, frame in tables:
        frame = _plain_strings(frame)
        if fmt == "csv":
            text = frame.to_csv(index=False)  # floats as repr: exact
            atomic_write(
                path,
                lambda tmp, text=text: Path(tmp).write_text(text, encoding="utf-8"),
                links_ok=True,
            )
        else:
            write_parquet(frame, path, links_ok=True)
        written.append(path)
    return written
