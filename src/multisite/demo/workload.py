"""The demo's application: bank transfers committed to an instance server from a thread.

Each transaction is a few updates: two account balances and a log entry, and every tenth one also
removes an old log entry (so that deletes replicate too). They go at a steady offered rate, so that
an act's story takes the same time on a fast machine as on a slow one (which may fall short of the
rate, and then simply runs as fast as it can). The thread remembers when each seqno was
acknowledged, which gives a secondary's replication lag as the demo sees it: the age of the oldest
acknowledged transaction the secondary has not applied yet.
"""

from __future__ import annotations

import random
import threading
import time

from ..testing.cluster import Node

REGION = "acct"
ACCOUNTS = 1000
LOG_KEEP = 500  # every tenth transaction removes the log entry this many transactions old


class WorkloadFailed(Exception):
    """The workload's thread stopped on an error (the act reports it and fails)."""


class TransferWorkload:
    def __init__(self, node: Node, transactions: int, *, rate_per_s: float, seed: int = 11):
        self.node = node
        self.transactions = transactions
        self.rate_per_s = rate_per_s
        self.rng = random.Random(seed)
        self.committed = 0
        self.last_seqno = 0
        self.error: BaseException | None = None
        self._acked_at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-workload", daemon=True)

    def start(self) -> None:
        with self.node.client() as db:
            db.create_region(REGION)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def done(self) -> bool:
        return self._thread.ident is not None and not self._thread.is_alive()

    def lag_s(self, applied_seqno: int) -> float:
        """Seconds since the primary acknowledged the first transaction after ``applied_seqno``."""
        at = self._acked_at.get(applied_seqno + 1)
        return 0.0 if at is None else time.monotonic() - at

    def _run(self) -> None:
        try:
            with self.node.client() as db:
                t0 = time.monotonic()
                for i in range(self.transactions):
                    if self._stop.wait(max(0.0, t0 + i / self.rate_per_s - time.monotonic())):
                        return
                    with db.transaction() as tx:
                        self._transfer(tx, i)
                    self._acked_at[tx.seqno] = time.monotonic()
                    self.last_seqno, self.committed = tx.seqno, i + 1
        except BaseException as e:  # reported by the act, which owns the console
            self.error = e

    def _transfer(self, tx, i: int) -> None:
        rng = self.rng
        a, b = rng.sample(range(ACCOUNTS), 2)
        amount = rng.randrange(1, 100)
        tx.set(REGION, ("acct", a), {"balance": rng.randrange(10_000), "txn": i})
        tx.set(REGION, ("acct", b), {"balance": rng.randrange(10_000), "txn": i})
        tx.set(REGION, ("log", i), {"from": a, "to": b, "amount": amount})
        if i % 10 == 0 and i >= LOG_KEEP:
            tx.zkill(REGION, ("log", i - LOG_KEEP))
