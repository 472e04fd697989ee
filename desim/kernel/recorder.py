"""The recorder: measures a run at checkpoint times, apart from the protocol's code.

At each checkpoint it asks the protocol for its estimates and scores them against the truth
(`mse`: the mean over agents of the squared error), and reads the network's message counters
(`messages_<kind>`, and `dropped_<kind>` when links can fail). Per-agent squared errors are
kept on request, with every per-agent value a metric returns (an array of one value per agent,
e.g. the privacy ledger's ``eps_<who>``) as a column beside them.

Further metrics are functions `(protocol, data_source) -> {name: value}` registered in
`desim.kernel.registry.METRICS` and chosen by name (a study's ``[study] metrics``): protocols expose
state, these functions compare it with the truth the data source holds. When the source's means
move (`DataSource.drifts`), every score is against the truth at the checkpoint's slot: the MSE
against each agent's mean then, and metrics receive the source as it is then (`DataSource.at`).
A function returns an empty dict when the protocol has no state it can measure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from desim.kernel.network import Network
from desim.kernel.protocol import DataSource, Protocol

#: A metric function: the protocol and the data source in, named values out.
MetricFn = Callable[[Protocol, DataSource], dict[str, float]]


def log_checkpoints(t_max: int, n: int = 60) -> np.ndarray:
    """About `n` log-spaced integer slots in [1, t_max], always including 1 and `t_max`."""
    if t_max < 1:
        raise ValueError(f"t_max = {t_max}: must be ≥ 1")
    points = np.unique(np.round(np.logspace(0, np.log10(t_max), max(n, 2))).astype(np.int64))
    return np.union1d(points[(points >= 1) & (points <= t_max)], [t_max])


class Recorder:
    """Collects tidy (t, metric, value) records of one run."""

    def __init__(
        self,
        protocol: Protocol,
        network: Network,
        truth: np.ndarray,
        per_agent: bool = False,
        data: DataSource | None = None,
        metrics: Sequence[MetricFn] = (),
    ) -> None:
        self.protocol = protocol
        self.network = network
        self.truth = truth
        self.per_agent = per_agent
        self.data = data
        self.metric_fns = tuple(metrics)
        self._rows: list[tuple[float, str, float]] = []
        self._agents: list[np.ndarray] = []
        self._agent_t: list[float] = []
        #: Per-agent metric values by name, then by checkpoint index (`_agent_t`'s).
        self._agent_values: dict[str, dict[int, np.ndarray]] = {}

    def measure(self, t: float) -> None:
        """Record every metric at time `t`, scored against the truth at slot `t` (the means of
        a drifting source then, `DataSource.at`)."""
        data, truth = self.data, self.truth
        if getattr(data, "drifts", False):
            data = data.at(int(t))
            truth = data.means
        err2 = (np.asarray(self.protocol.estimates(), dtype=float) - truth) ** 2
        if err2.ndim > 1:  # vector estimates: squared Euclidean error per agent
            err2 = err2.sum(axis=tuple(range(1, err2.ndim)))
        self._rows.append((t, "mse", float(err2.mean())))
        for kind, sent, dropped in zip(
            self.network.kinds, self.network.sent, self.network.dropped, strict=True
        ):
            self._rows.append((t, f"messages_{kind}", float(sent)))
            if not self.network.links.ideal:
                self._rows.append((t, f"dropped_{kind}", float(dropped)))
        for fn in self.metric_fns:
            for name, value in fn(self.protocol, data).items():
                if np.ndim(value) == 0:
                    self._rows.append((t, name, float(value)))
                elif self.per_agent:  # one value per agent: a column of agents()
                    column = self._agent_values.setdefault(name, {})
                    column[len(self._agent_t)] = np.asarray(value, dtype=float)
        if self.per_agent:
            self._agents.append(err2)
            self._agent_t.append(t)

    def metrics(self) -> pd.DataFrame:
        """Records as a DataFrame with columns t, metric, value."""
        t, metric, value = zip(*self._rows, strict=True) if self._rows else ((), (), ())
        return pd.DataFrame({"t": np.asarray(t, float), "metric": list(metric), "value": value})

    def agents(self) -> pd.DataFrame | None:
        """Per-agent squared errors (columns t, agent, value) and a column per per-agent metric
        (NaN at checkpoints where it recorded nothing), or None if not kept."""
        if not self.per_agent:
            return None
        n, k = len(self.truth), len(self._agent_t)
        columns = {
            "t": np.repeat(self._agent_t, n),
            "agent": np.tile(np.arange(n), k),
            "value": np.concatenate(self._agents) if self._agents else [],
        }
        for name, values in self._agent_values.items():
            column = np.full((k, n), np.nan)
            for i, v in values.items():
                column[i] = v
            columns[name] = column.ravel()
        return pd.DataFrame(columns)
