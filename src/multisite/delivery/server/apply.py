"""Applying a received message: its transactions, in offset order, as one local commit together with
the link's ``(user, "in")`` row (``log_received``), so that after any crash either both are there or
neither: a message is applied exactly once.

Conflicts (only where the sender is a remote, i.e. on the consolidated instance): an update from a
remote carries its before-image, the row as the remote had it when it changed it. If the row here is
no longer that, both sides changed it since their last exchange. The rule: **the consolidated
instance's copy wins**: the remote's update is not applied and a row goes to ``sysconflict``
(``(user, offset, n)`` -> region, key, the remote's value and before-image, the value kept, the rule).
The consolidated copy reaches the remote through the ordinary flow (its change is after the remote's
last exchange, so it is on its way), and a remote applies what the consolidated instance sends
without a check: both sides end with the consolidated copy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...journal.records import SET
from ...keys import encode_key
from ...values import encode_value
from ..message import Tx
from ..sysremote import CONFLICT_REGION, SYSTEM_REGIONS

RULE_CONSOLIDATED_WINS = "consolidated-wins"


@dataclass
class Applied:
    transactions: int = 0
    updates: int = 0
    conflicts: int = 0
    refused: int = 0
    seqno: int = 0


def _current(db, region: str, key: tuple, overlay: dict) -> bytes | None:
    kb = encode_key(key)
    if (region, kb) in overlay:
        return overlay[(region, kb)]
    if region not in db.regions():
        return None
    rows = db.page(region, kb, None, 1)
    return rows[0][1] if rows and rows[0][0] == kb else None


def apply_message(db, user: str, txs: list[Tx], state_op: tuple, *, check_conflicts: bool,
                  regions_allowed: frozenset[str] | None = None, now: float | None = None) -> Applied:
    """Commit ``txs`` and ``state_op`` as one transaction; see the module's docstring for conflicts.
    Updates outside ``regions_allowed`` (the link's publication; None: any) are not applied: a remote
    changes only what it subscribes to (counted in ``refused``)."""
    now = time.time() if now is None else now
    res = Applied()
    ops: list[tuple] = []
    overlay: dict[tuple[str, bytes], bytes | None] = {}
    regions = db.regions()
    for tx in txs:
        res.transactions += 1
        for n, u in enumerate(tx.updates):
            if u.region in SYSTEM_REGIONS or (regions_allowed is not None and u.region not in regions_allowed):
                res.refused += 1  # never published, or not this link's: not ours to apply
                continue
            if u.region not in regions:
                db.create_region(u.region)
                regions[u.region] = True
            if check_conflicts:
                cur = _current(db, u.region, u.key, overlay)
                if cur != u.before:
                    res.conflicts += 1
                    ops.append((SET, CONFLICT_REGION, (user, tx.offset, n), encode_value({
                        "region": u.region, "key": list(u.key), "op": u.op, "remote_value": u.value,
                        "remote_before": u.before, "kept_value": cur, "rule": RULE_CONSOLIDATED_WINS,
                        "time": now})))
                    continue
                overlay[(u.region, encode_key(u.key))] = u.value if u.op == SET else None
            ops.append((u.op, u.region, u.key, u.value if u.op == SET else None))
            res.updates += 1
    ops.append(state_op)
    res.seqno = db.commit_updates(ops)
    return res

