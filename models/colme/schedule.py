"""Private-ColME's query schedules (seed 002 §III-E): round robin and restricted round robin.

RR: agent a queries a+1, a+2, … (mod M), skipping itself, so every agent is queried exactly once
per slot; agent a's k-th other agent is at RR position k (Prop. 3's ℓ). rRR skips agents outside
C_a^{(t-1)}; an agent that excludes everyone sends no more queries.
"""

from __future__ import annotations

import numpy as np

from desim.models.colme.model import rr_offset
from desim.models.colme.pairs import ClassBeliefs


class RoundRobin:
    """RR: in slot t every agent a queries a + `rr_offset(t, M)` (mod M)."""

    def __init__(self, n_agents: int) -> None:
        self.agents = np.arange(n_agents)
        self._twice = np.concatenate((self.agents, self.agents))  # read-only: RR's targets
        self._twice.flags.writeable = False

    def targets(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The queriers a and queried agents b of slot t."""
        a = self.agents
        offset = rr_offset(t, len(a))
        return a, self._twice[offset : offset + len(a)]  # (a + offset) mod M: 0…M−1 twice

    def batch(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The queriers and queried agents of several slots, slot by slot."""
        m = len(self.agents)
        b = (self.agents + rr_offset(slots, m)[:, None]) % m
        return np.tile(self.agents, len(slots)), b.ravel()


class RestrictedRoundRobin:
    """rRR: each agent queries its next RR position whose agent it still includes."""

    def __init__(self, beliefs: ClassBeliefs) -> None:
        self.beliefs = beliefs
        m = len(beliefs.n_included)
        self.agents = np.arange(m)
        self.offset = np.zeros(m, dtype=np.int64)  # RR position last queried, 0 = none yet

    def targets(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The queriers a (those including someone besides themselves) and their targets b."""
        m = len(self.agents)
        agents = self.agents[self.beliefs.n_included > 1]
        offset = self.offset[agents]
        ahead = np.arange(1, min(16, m - 1) + 1)
        todo = np.arange(len(agents))
        included = self.beliefs.included
        while len(todo):  # look a window of positions ahead; rarely nobody in it is included
            a = agents[todo]
            cand = (offset[todo, None] + ahead - 1) % (m - 1) + 1
            hit = included[a[:, None], (a[:, None] + cand) % m]
            first = hit.argmax(axis=1)
            rows = np.arange(len(todo))
            found = hit[rows, first]
            offset[todo] = np.where(found, cand[rows, first], cand[:, -1])
            todo = todo[~found]
        self.offset[agents] = offset
        return agents, (agents + offset) % m


def max_pair_releases(schedule: str, n_agents: int, t_max: int) -> int:
    """κ_max: the most releases one responder can make to one querier in slots 1…t_max.

    Under RR, agent a queries b only in the slots where `rr_offset` is b − a (mod M), one in
    M − 1, so at most ⌈t_max/(M − 1)⌉ times (offset 1 is queried from slot 1). Under rRR a may
    exclude every agent but b and query b every slot, so t_max — the schedule's worst case,
    which does not depend on the data. Every release answers a query of its querier, so links
    (losses, latency, repeats) never make more.
    """
    if schedule == "rr" and n_agents > 1:
        return -(-int(t_max) // (n_agents - 1))
    return int(t_max)
