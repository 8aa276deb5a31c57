"""An instance's regions, read from its store's catalogue without opening the instance."""

from __future__ import annotations

import sqlite3

from ..instance.layout import Layout


def store_regions(layout: Layout) -> dict[str, tuple[bool, str | None]]:
    """Regions from the store's catalogue, read-only (safe while the instance is live)."""
    if not layout.store_file.exists():
        return {}
    conn = sqlite3.connect(f"file:{layout.store_file}?mode=ro", uri=True)
    try:
        return {name: (bool(repl), schema)
                for name, repl, schema in conn.execute("SELECT name, replicated, schema FROM regions")}
    finally:
        conn.close()
