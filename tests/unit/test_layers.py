"""The layering rules of STYLE.md, checked on the source: lower layers never import higher ones.

- cli, web, pipeline and net may import lower layers, never the reverse (``testing`` is exempt: its
  harnesses may start anything);
- protocol is sans-IO: it imports errors and value types only, and no sockets, asyncio or clock.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import multisite

SRC = Path(multisite.__file__).parent
HIGH = {"cli", "web", "pipeline", "net"}
EXEMPT = {"testing"}
PROTOCOL_MAY_IMPORT = {"errors", "keys", "values", "journal.records", "protocol"}
PROTOCOL_STDLIB_BANNED = {"socket", "ssl", "asyncio", "selectors", "time", "threading", "subprocess"}


def _modules():
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield p, parts


def _imports(path: Path, parts: list[str]):
    """Every import as ``(absolute module, is_multisite)``; relative imports resolved."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, a.name == "multisite" or a.name.startswith("multisite.")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["multisite", *parts] if is_pkg else ["multisite", *parts[:-1]]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
                if not node.module:  # from . import x, y: each name may be a module
                    for a in node.names:
                        yield f"{mod}.{a.name}", True
                    continue
                yield mod, True
            else:
                yield node.module, node.module == "multisite" or node.module.startswith("multisite.")


def _sub(mod: str) -> str:
    """``multisite.journal.records`` -> ``journal.records``."""
    return mod.split(".", 1)[1] if "." in mod else ""


CASES = [(p, parts) for p, parts in _modules()]


@pytest.mark.parametrize("path,parts", CASES, ids=[".".join(x) or "multisite" for _, x in CASES])
def test_lower_layers_do_not_import_higher_ones(path, parts):
    if not parts:  # the package root is the public facade: it re-exports every layer's API
        return
    top = parts[0]
    if top in HIGH or top in EXEMPT:
        return
    for mod, ours in _imports(path, parts):
        if ours:
            target = _sub(mod).split(".")[0]
            assert target not in HIGH, f"{path.relative_to(SRC)} (a lower layer) imports {mod}"


@pytest.mark.parametrize("path,parts", [c for c in CASES if c[1][:1] == ["protocol"]],
                         ids=lambda x: str(x) if isinstance(x, list) else None)
def test_protocol_is_sans_io(path, parts):
    for mod, ours in _imports(path, parts):
        if ours:
            sub = _sub(mod)
            assert any(sub == ok or sub.startswith(ok + ".") for ok in PROTOCOL_MAY_IMPORT), (
                f"{path.relative_to(SRC)} imports {mod}: protocol imports only errors and value types")
        else:
            assert mod.split(".")[0] not in PROTOCOL_STDLIB_BANNED, (
                f"{path.relative_to(SRC)} imports {mod}: no sockets, asyncio or clock inside the protocol")


def test_the_walker_sees_relative_imports():
    (path, parts), = [c for c in CASES if c[1] == ["journal", "reader"]]
    mods = {m for m, ours in _imports(path, parts) if ours}
    assert {"multisite.errors", "multisite.journal.records", "multisite.journal.segments"} <= mods
