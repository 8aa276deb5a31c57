"""Helpers for failover scenarios: labelled transactions, polling, and what each instance holds.

A scenario names every transaction (``"A97"``, ``"M38"``, ``"B61"``): the transaction sets region
``t`` key ``(label,)`` to the label. What an instance holds is then read from its journal, in seqno
order, as a list of labels, and what a rollback took off it from its lost-transaction files.

    commit(ardmore, "A97")
    wait_has(brynmawr, "A97")
    assert labels(brynmawr) == [..., "A97"]
    assert lost_labels(ardmore) == [["A99"]]

Waiting polls with a deadline (``wait_for``); nothing sleeps for a fixed time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from ..errors import MultisiteError
from ..journal.reader import iter_records
from ..journal.lostfile import LostFile, list_lost_files
from ..values import decode_value

REGION = "t"
WAIT_TIMEOUT_S = 30.0
POLL_S = 0.02


class ScenarioTimeout(AssertionError):
    """A condition a scenario waits for did not come true in time."""


def wait_for(pred: Callable[[], Any], what: str, timeout_s: float = WAIT_TIMEOUT_S) -> Any:
    """Poll ``pred`` until it returns a true value (returned); fail with ``what`` after the deadline."""
    deadline = time.monotonic() + timeout_s
    last_err: Exception | None = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except (MultisiteError, OSError) as e:
            last_err = e
        if time.monotonic() >= deadline:
            raise ScenarioTimeout(f"timed out after {timeout_s} s waiting for {what}"
                                  + (f" (last error: {last_err})" if last_err else ""))
        time.sleep(POLL_S)


def commit(node, label: str, region: str = REGION) -> int:
    """Commit the transaction named ``label`` on the running instance ``node``; its seqno."""
    with node.client() as db:
        if region not in db._call("regions"):
            db.create_region(region)
        return db.set(region, (label,), label)


def has(node, label: str, region: str = REGION) -> bool:
    """Does the running instance ``node`` hold the transaction ``label`` (applied to its store)?"""
    with node.client() as db:
        if region not in db._call("regions"):
            return False
        return db.get(region, (label,)) == label


def wait_has(node, *labels_: str, timeout_s: float = WAIT_TIMEOUT_S) -> None:
    for lb in labels_:
        wait_for(lambda: has(node, lb), f"{node.name} to hold {lb}", timeout_s)


def record_labels(records, region: str = REGION) -> list[str]:
    out = []
    for rec in records:
        for u in rec.updates:
            if u.region == region and u.value is not None:
                out.append(decode_value(u.value))
    return out


def labels(node_or_root, region: str = REGION) -> list[str]:
    """The labelled transactions in an instance's journal, in seqno order."""
    root = Path(getattr(node_or_root, "root", node_or_root))
    return record_labels(iter_records(root / "journal"), region)


def tagged(node_or_root) -> list[tuple[int, int, int, str]]:
    """``(seqno, stream, stream_seqno, origin)`` of every journal record, in seqno order."""
    root = Path(getattr(node_or_root, "root", node_or_root))
    return [(r.seqno, r.stream, r.stream_seqno, r.origin) for r in iter_records(root / "journal")]


def lost_files(node_or_root) -> list[Path]:
    root = Path(getattr(node_or_root, "root", node_or_root))
    return list_lost_files(root / "lost")


def lost_labels(node_or_root, region: str = REGION) -> list[list[str]]:
    """For each lost-transaction file of an instance (oldest first), its labels in commit order."""
    return [record_labels(LostFile.read(p).records(), region) for p in lost_files(node_or_root)]
