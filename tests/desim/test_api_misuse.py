"""The Python API refuses misuse with the same one-line `ConfigError` as study files (never a
raw Python exception), and takes numpy integers where integers are expected."""

from __future__ import annotations

import numpy as np
import pytest

import desim
from desim import ConfigError, Scenario

OK = {"protocol": "local", "t_max": 5}
BAD_SCENARIOS = {
    "protocol": None,
    "params": [1],
    "data": "classes",
    "network": "ideal",
    "t_max": 10**15,
    "seed": 1.5,
    "replicate": -1,
    "checkpoints": 10**15,
    "per_agent": "yes",
    "name": 3,
    "topology": "ring",
    "metrics": "accuracy",
}


@pytest.mark.parametrize("field", sorted(BAD_SCENARIOS))
def test_a_bad_scenario_field_is_one_line_naming_it(field):
    with pytest.raises(ConfigError) as info:
        desim.run(Scenario(**{**OK, field: BAD_SCENARIOS[field]}))
    message = str(info.value)
    assert field in message and "\n" not in message


@pytest.mark.parametrize(
    "call",
    [
        lambda: desim.run("local"),
        lambda: desim.run(None),
        lambda: desim.load_study(None),
        lambda: desim.load_study(3),
        lambda: desim.run_study("studies/colme-fig2"),
        lambda: desim.load(None),
    ],
)
def test_wrong_objects_are_refused_in_one_line(call):
    with pytest.raises(ConfigError) as info:
        call()
    assert "\n" not in str(info.value)


def test_numpy_integers_are_integers():
    out = desim.run(
        Scenario(
            "local",
            t_max=np.int64(6),
            seed=np.int32(2),
            data={"model": "classes", "agents": np.int64(5)},
        )
    )
    assert out.metrics["t"].max() == 6
