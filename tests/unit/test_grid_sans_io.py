"""The grid's modules so far are sans-IO: no sockets, asyncio, clock, threads or processes inside."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import multisite

GRID = Path(multisite.__file__).parent / "grid"
BANNED = {"socket", "ssl", "asyncio", "selectors", "time", "threading", "subprocess", "random", "os"}
MAY_IMPORT = {"multisite.errors", "multisite.keys", "multisite.values", "multisite.grid", "multisite.protocol.framing",
              "multisite.ha.decide",  # the lease's fencing deadline, shared with ha/ (sans-IO too)
              "multisite.protocol.auth"}  # the users' rights, shared with the instance server (sans-IO too)


@pytest.mark.parametrize("path", sorted(GRID.glob("*.py")), ids=lambda p: p.name)
def test_grid_modules_do_no_io(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = "multisite.grid" if node.level == 1 else "multisite"
                names = [f"{base}.{node.module}" if node.module else base]
            else:
                names = [node.module]
        else:
            continue
        for n in names:
            if n.startswith("multisite"):
                assert any(n == ok or n.startswith(ok + ".") for ok in MAY_IMPORT), f"{path.name} imports {n}"
            else:
                assert n.split(".")[0] not in BANNED, f"{path.name} imports {n}: the grid's logic is sans-IO"
