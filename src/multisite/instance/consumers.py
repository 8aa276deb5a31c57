"""Positions of journal consumers (Spark streaming queries) that do not own the instance.

The instance file belongs to the process holding the instance lock, so a reader that runs beside a
live instance (a Spark stream) cannot write its slot there. Each consumer instead keeps one small
file, ``<instance>/consumers/<name>.pos``, replaced atomically: ``{"name", "last_confirmed",
"updated"}``. ``prune`` keeps every segment holding a seqno above the lowest ``last_confirmed`` of
these files, exactly as it does for the ``consumer`` slots of the instance file. Removing a file
(``forget``) releases what it held.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..fsutil import atomic_write, ensure_dir, fsync_dir
from .layout import Layout

SUFFIX = ".pos"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


@dataclass(frozen=True)
class ConsumerPos:
    name: str
    last_confirmed: int
    updated: float


def consumers_dir(layout: Layout) -> Path:
    return layout.root / "consumers"


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise ConfigError(f"consumer name {name!r} must be 1-100 letters, digits, '.', '_' or '-'")
    return name


def record(layout: Layout, name: str, last_confirmed: int) -> None:
    """Record that consumer ``name`` has consumed every seqno up to ``last_confirmed``."""
    d = consumers_dir(layout)
    ensure_dir(d)
    body = {"name": check_name(name), "last_confirmed": int(last_confirmed), "updated": time.time()}
    atomic_write(d / f"{name}{SUFFIX}", json.dumps(body).encode())


def load_all(layout: Layout) -> list[ConsumerPos]:
    d = consumers_dir(layout)
    out = []
    for p in sorted(d.glob(f"*{SUFFIX}")) if d.exists() else []:
        try:
            body = json.loads(p.read_text())
            out.append(ConsumerPos(str(body["name"]), int(body["last_confirmed"]), float(body.get("updated", 0))))
        except (ValueError, KeyError, TypeError, OSError) as e:
            # An unreadable position must not let prune remove what it protects.
            raise ConfigError(f"consumer position file {p} is unreadable ({e}); fix or remove it") from None
    return out


def forget(layout: Layout, name: str) -> bool:
    p = consumers_dir(layout) / f"{check_name(name)}{SUFFIX}"
    if p.exists():
        p.unlink()
        fsync_dir(p.parent)
        return True
    return False
