"""The synchronous transport of ideal links: every send is one batch, delivered at once.

Ideal links are always up with zero latency (the papers' model), so nothing is drawn and
nothing is dropped: a send is filed whole under the current instant and handed over in send
order after the tick, the delivery or the deadline that made it (`Instants`' filing).
"""

from __future__ import annotations

import numpy as np

from desim.kernel.messages import Batch, SenderBatch, undeclared_kind
from desim.kernel.transports.instants import Instants


class Synchronous(Instants):
    """Ideal links: one batch per send, no draws, no drops (see the module)."""

    checks_receivers = False

    def send(
        self,
        kind: str,
        src: np.ndarray,
        dst: np.ndarray,
        payload: np.ndarray | None = None,
        at: np.ndarray | None = None,
        ids: np.ndarray | None = None,
    ) -> None:
        """File the messages whole under now: one batch, no draws (`Transport.send`)."""
        try:
            code = self.kinds.index(kind)
        except ValueError:  # a kind the protocol does not declare: say which are
            raise undeclared_kind(kind, self.kinds) from None
        src, dst, payload = self._columns(src, dst, payload)
        n = len(src)
        if n == 0:
            return
        now = float(self.env.now)
        self.sent[code] += n
        self._file(
            now,
            Batch(
                src, dst, self._codes(code, n), payload, self._sent_now(now, n), self.kinds, code
            ),
        )

    def send_batch(self, kind: str, batch: SenderBatch) -> None:
        """File `batch` whole under now, its columns not made (`Transport.send_batch`)."""
        try:
            code = self.kinds.index(kind)
        except ValueError:
            raise undeclared_kind(kind, self.kinds) from None
        n = len(batch)
        if n == 0:
            return
        now = float(self.env.now)
        self.sent[code] += n
        batch.kinds, batch.kind, batch.single_kind = self.kinds, self._codes(code, n), code
        batch.sent_at = self._sent_now(now, n)
        self._file(now, batch)
