"""Config hashes: what results are keyed by. Each must stay byte-for-byte what it was, or every
committed result would look stale (`tests/desim/test_study_spec.py` pins them)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any

from desim.kernel.registry import PROTOCOLS
from desim.study.scenario import Scenario


def canonical_text(obj: Any) -> str:
    """The canonical JSON of `obj` (sorted keys, no spaces): what config hashes hash."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def canonical_hash(obj: Any) -> str:
    """sha256 (hex) of the canonical JSON of `obj` (sorted keys, no spaces)."""
    return hashlib.sha256(canonical_text(obj).encode()).hexdigest()


def run_hash(scenario: Scenario, values: dict[str, Any]) -> str:
    """The config hash of a run: its scenario and the grid values that reach it.

    Only the reaching values: a run the sweep does not change has one hash (and runs once); a
    reached one keeps its old hash.
    """
    return canonical_hash({"scenario": scenario.as_dict(), "grid": values})


class _Slot:
    """Stands for the replicate number in a scenario's JSON (`replicate_hashes`)."""

    def __str__(self) -> str:
        return _SLOT


#: What `_Slot` is written as (a JSON string no TOML value of a study file holds in practice;
#: `replicate_hashes` checks it occurs once, else hashes each replicate in full).
_SLOT = "\x00desim replicate\x00"


def run_template(scenario: Scenario, values: dict[str, Any]) -> str:
    """The canonical JSON `run_hash` hashes, with the replicate number left as a slot (the
    same text for every replicate of a run)."""
    # `Scenario.as_dict` without its deep copy (JSON reads the tables as they are); that the
    # text is the one `run_hash` hashes is what `replicate_hashes`' tests check
    plain = {f.name: getattr(scenario, f.name) for f in dataclasses.fields(scenario)}
    del plain["folder"]
    if scenario.topology is None:
        del plain["topology"]
    if not scenario.metrics:
        del plain["metrics"]
    plain["replicate"] = _Slot()
    return canonical_text({"scenario": plain, "grid": values})


def replicate_hashes(
    scenario: Scenario, values: dict[str, Any], replicates: int, template: str | None = None
) -> list[str]:
    """`run_hash` of `scenario` at replicates 0 … `replicates` − 1, the same strings.

    A study of many replicates hashes each run; the JSON of a scenario differs between its
    replicates only in the replicate number, so it is written once (`template`, made by
    `run_template` when not given) and the number put in.
    """
    text = run_template(scenario, values) if template is None else template
    token = '"replicate":' + json.dumps(_SLOT)
    if text.count(json.dumps(_SLOT)) != 1 or text.count(token) != 1:
        return [
            run_hash(dataclasses.replace(scenario, replicate=r), values) for r in range(replicates)
        ]
    head, tail = text.split(token)
    # the text up to the number is hashed once, each replicate's hash goes on from a copy
    # (sha256 of a text hashed in pieces is that of the whole text)
    start = hashlib.sha256(f'{head}"replicate":'.encode())
    out = []
    for r in range(replicates):
        one = start.copy()
        one.update(f"{r}{tail}".encode())
        out.append(one.hexdigest())
    return out


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


def without_legacy_values(protocol: str, params: dict[str, Any]) -> dict[str, Any]:
    """`params` without the values its protocol declares as its behaviour from before the
    parameter existed (`legacy_values`, e.g. private-colme's peers = "all"): a scenario that
    states one keeps the config hash, random-stream keys and study hash it had without it."""
    try:
        legacy = PROTOCOLS.get(protocol).legacy_values
    except KeyError:  # (an unknown name is refused where the scenario is read)
        return params
    if not any(key in params and params[key] == value for key, value in legacy.items()):
        return params
    return {key: x for key, x in params.items() if key not in legacy or legacy[key] != x}


def study_hash(raw: dict, replicates: int, t_max: int, checkpoints: int, data: dict) -> str:
    """The config hash of a study: its file as read, with the effective (possibly --quick)
    horizon and data, without what only changes figures (nor legacy parameter values:
    `without_legacy_values`)."""
    effective = copy.deepcopy(raw)
    if isinstance(effective.get("scenario"), list):
        effective["scenario"] = [
            without_legacy_values(table.get("protocol"), table)
            if isinstance(table, dict) and isinstance(table.get("protocol"), str)
            else table
            for table in effective["scenario"]
        ]
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
    """A params dataclass as plain data (other objects as they are), without the fields it
    names in ``hash_omits_absent`` while they are None (hashes made before they existed)."""
    if not dataclasses.is_dataclass(obj):
        return obj
    out = dataclasses.asdict(obj)
    for name in getattr(obj, "hash_omits_absent", ()):
        if out.get(name) is None:
            out.pop(name, None)
    return out
