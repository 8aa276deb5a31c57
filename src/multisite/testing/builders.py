"""Small instances built by the real engine, for tests of fold, snapshot and verify (any tier)."""

from __future__ import annotations

from pathlib import Path

from .. import engine
from ..journal.reader import iter_records


def numbered(path: Path, name: str, n: int, *, region: str = "r", prefix: str = "k") -> Path:
    """An instance whose transactions 1..n each set ``region`` (prefix, i) to "v<i>"."""
    root = engine.create(path, name=name, durability="none")
    with engine.open(root) as db:
        db.create_region(region)
        for i in range(1, n + 1):
            db.set(region, (prefix, i), f"v{i}")
    return root


def replica_of(src: Path, path: Path, name: str, upto: int) -> Path:
    """A replica of ``src`` at ``upto``, filled as the Update Process fills it."""
    root = engine.create(path, name=name, durability="none")
    with engine.open(root) as db:
        db.create_region("r")
        for rec in iter_records(Path(src) / "journal", 1, upto):
            db.apply_record(rec)
    return root


def rewrite_after(root: Path, seqno: int, upto: int, prefix: str = "n") -> None:
    """Roll ``root`` back to ``seqno`` and commit other transactions up to ``upto``."""
    with engine.open(root) as db:
        db.rollback(seqno)
        for i in range(seqno + 1, upto + 1):
            db.set("r", (prefix, i), f"other{i}")


def state_of(root: Path) -> dict:
    """Every ``(region, key) -> value`` of an instance."""
    with engine.open(root) as db:
        return {(r, k): v for r in sorted(db.regions()) for k, v in db.items(r)}
