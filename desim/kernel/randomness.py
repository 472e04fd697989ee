"""Named random streams: every random draw comes from a named, seeded stream.

Every draw comes from a generator built from ``SeedSequence(root, spawn_key=(key, replicate,
stream))``, where ``stream`` is a stable number derived from the stream's name. Keys are
content hashes, never positions, so adding a grid point or a scenario never shifts another
run's seeds, and the result of a run does not depend on which worker runs it or when.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np


def stable_key(obj: Any) -> int:
    """A 32-bit key of a JSON-serialisable object that is the same on every machine and run."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


class Streams:
    """The random streams of one run.

    ``shared_key`` keys the streams that must be identical across the protocols compared in
    one study (common random numbers: ``data``, ``population``, ``topology`` and
    ``adversaries``); ``run_key`` keys every other stream (DP noise, links, latency, ...),
    which belongs to one scenario.
    """

    #: Streams that depend only on the data set-up and the replicate, not on the protocol
    #: (``adversaries``: who the adversaries are, the same for every protocol compared;
    #: ``rewire``: how a changing graph changes).
    SHARED = frozenset({"data", "population", "topology", "rewire", "adversaries"})

    def __init__(self, root: int, replicate: int, shared_key: int, run_key: int) -> None:
        self.root = int(root)
        self.replicate = int(replicate)
        self.shared_key = int(shared_key)
        self.run_key = int(run_key)
        self._made: dict[str, np.random.Generator] = {}

    def spawn_key(self, name: str) -> tuple[int, int, int]:
        """The spawn key of the stream called `name` (recorded in the manifest)."""
        key = self.shared_key if name in self.SHARED else self.run_key
        return (key, self.replicate, stable_key(name))

    def get(self, name: str) -> np.random.Generator:
        """The generator of stream `name`; asking twice returns the same generator."""
        if name not in self._made:
            seq = np.random.SeedSequence(self.root, spawn_key=self.spawn_key(name))
            self._made[name] = np.random.Generator(np.random.PCG64(seq))
        return self._made[name]
