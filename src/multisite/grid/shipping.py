"""Where a replica shard starts from when it subscribes to its primary, sans-IO.

Every shard of a partition journals the primary's frames byte for byte (a synchronous replica
journals a prepare before the primary commits it; an asynchronous one what the primary committed),
so two shards hold the same transaction at a seqno exactly when their frames there are equal. A
replica sends its seqno and the digests of its last ``TAIL_FRAMES`` frames; the primary compares them
with its own journal and answers with one ``Start``:

- ``CATCH_UP`` from the replica's seqno + 1: the replica's last frame is the primary's (or it has
  none and seqno 0), and the primary's journal still holds what follows;
- ``RESYNC`` to the newest seqno both hold: the replica holds transactions the primary does not (a
  prepare the primary rolled back, or commits of a deposed primary with ``min_sync = 0``); it cuts
  back to it (into a lost-transaction file) and subscribes again;
- ``CHECKPOINT``: nothing in the tail matches, the primary's journal no longer reaches back to the
  replica, or the replica is further behind than ``checkpoint_after`` transactions: it starts over
  from a checkpoint of the primary's state plus the frames after it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum

TAIL_FRAMES = 64
CHECKPOINT_AFTER_DEFAULT = 200_000  # behind by more: a checkpoint copies faster than replaying the journal


def digest(frame: bytes | memoryview) -> bytes:
    return hashlib.blake2b(frame, digest_size=12).digest()


class StartKind(Enum):
    CATCH_UP = "catch-up"
    RESYNC = "resync"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Start:
    kind: StartKind
    seqno: int  # CATCH_UP: the replica's seqno (frames follow from seqno + 1); RESYNC: cut back to it
    why: str


def start_point(*, primary_seqno: int, journal_first: int, primary_digests: dict[int, bytes],
                replica_seqno: int, replica_tail: list[tuple[int, bytes]],
                checkpoint_after: int = CHECKPOINT_AFTER_DEFAULT) -> Start:
    """Decide how a replica at ``replica_seqno`` with ``replica_tail`` starts.

    ``primary_seqno``: the primary's last committed seqno; ``journal_first``: the first seqno its
    journal files hold; ``primary_digests``: its frames' digests for the seqnos of the replica's tail
    that it holds (the caller reads them)."""
    if replica_seqno == 0:
        if journal_first <= 1 and primary_seqno <= checkpoint_after:
            return Start(StartKind.CATCH_UP, 0, "a new replica: the whole journal follows")
        return Start(StartKind.CHECKPOINT, 0, "a new replica: a checkpoint of the primary's state")
    common = 0
    for seqno, d in reversed(replica_tail):
        if seqno <= primary_seqno and primary_digests.get(seqno) == d:
            common = seqno
            break
    if common == 0:
        if not replica_tail:
            return Start(StartKind.CHECKPOINT, 0, f"the replica at seqno {replica_seqno} has no frame to check")
        return Start(StartKind.CHECKPOINT, 0, f"none of the replica's last {len(replica_tail)} frames (to seqno "
                                              f"{replica_seqno}) is the primary's: the histories diverged")
    if common < replica_seqno:
        return Start(StartKind.RESYNC, common, f"the replica holds seqnos {common + 1}..{replica_seqno} that the "
                                               f"primary (at {primary_seqno}) does not")
    if common + 1 < journal_first:
        return Start(StartKind.CHECKPOINT, 0, f"the primary's journal starts at seqno {journal_first}, after the "
                                              f"replica's {common}")
    if primary_seqno - common > checkpoint_after:
        return Start(StartKind.CHECKPOINT, 0, f"the replica is {primary_seqno - common:,} transactions behind")
    return Start(StartKind.CATCH_UP, common, f"the replica's journal is the primary's up to seqno {common}")
