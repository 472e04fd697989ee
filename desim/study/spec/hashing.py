"""Config hashes: what results are keyed by. Each must stay byte-for-byte what it was, or every
committed result would look stale (`tests/desim/test_study_spec.py` pins them)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any

from desim.study.scenario import Scenario


def canonical_hash(obj: Any) -> str:
    """sha256 (hex) of the canonical JSON of `obj` (sorted keys, no spaces)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def run_hash(scenario: Scenario, values: dict[str, Any]) -> str:
    """The config hash of a run: its scenario and the grid values that reach it.

    Only the reaching values: a run the sweep does not change has one hash (and runs once); a
    reached one keeps its old hash.
    """
    return canonical_hash({"scenario": scenario.as_dict(), "grid": values})


def curve_hash(kind: str, params: Any, data: Any, t_max: int, checkpoints: int) -> str:
    """The config hash of a curve job: what its values depend on (equal hashes are one
    computation, and a cache hit)."""
    return canonical_hash(
        {
            "kind": kind,
            "params": _plain(params),
            "data": _plain(data),
            "t_max": t_max,
            "checkpoints": checkpoints,
        }
    )


def study_hash(raw: dict, replicates: int, t_max: int, checkpoints: int, data: dict) -> str:
    """The config hash of a study: its file as read, with the effective (possibly --quick)
    horizon and data, without what only changes figures."""
    effective = copy.deepcopy(raw)
    effective["study"] = {
        **raw["study"],
        "replicates": replicates,
        "t_max": t_max,
        "checkpoints": checkpoints,
    }
    effective["data"] = data
    effective.pop("quick", None)
    effective.pop("plot", None)  # figures do not change results: retitling keeps the hash
    for table in effective.get("curve", []):  # nor does which scenario's colour a curve takes
        if isinstance(table, dict):
            table.pop("scenario", None)
    return canonical_hash(effective)


def _plain(obj: Any) -> Any:
    """A params dataclass as plain data (other objects as they are)."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
