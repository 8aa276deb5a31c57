"""The layering rules of STYLE.md, checked on the source: lower layers never import higher ones.

- cli, web, pipeline and net may import lower layers, never the reverse (``testing`` is exempt: its
  harnesses may start anything);
- protocol is sans-IO: it imports errors and value types only, and no sockets, asyncio or clock;
- so is replication's session policy (``replication/session.py``): the servers in ``net`` do its I/O
  and give it the time.
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
# Sans-IO modules outside protocol/, and what each may import besides PROTOCOL_MAY_IMPORT.
SANS_IO_ELSEWHERE = {("replication", "session"): {"instance.instance_file", "replication.history"}}


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


SANS_IO = [(p, parts, PROTOCOL_MAY_IMPORT) for p, parts in CASES if parts[:1] == ["protocol"]] + [
    (p, parts, PROTOCOL_MAY_IMPORT | SANS_IO_ELSEWHERE[tuple(parts)]) for p, parts in CASES
    if tuple(parts) in SANS_IO_ELSEWHERE]


@pytest.mark.parametrize("path,parts,may_import", SANS_IO, ids=[".".join(x) for _, x, _ in SANS_IO])
def test_sans_io_modules_import_no_io(path, parts, may_import):
    for mod, ours in _imports(path, parts):
        if ours:
            sub = _sub(mod)
            assert any(sub == ok or sub.startswith(ok + ".") for ok in may_import), (
                f"{path.relative_to(SRC)} imports {mod}: a sans-IO module imports only errors, value types "
                f"and other sans-IO modules")
        else:
            assert mod.split(".")[0] not in PROTOCOL_STDLIB_BANNED, (
                f"{path.relative_to(SRC)} imports {mod}: no sockets, asyncio or clock in a sans-IO module")


def test_every_sans_io_module_outside_protocol_is_checked():
    assert {tuple(parts) for _, parts, _ in SANS_IO if parts[0] != "protocol"} == set(SANS_IO_ELSEWHERE)


def test_the_walker_sees_relative_imports():
    (path, parts), = [c for c in CASES if c[1] == ["journal", "reader"]]
    mods = {m for m, ours in _imports(path, parts) if ours}
    assert {"multisite.errors", "multisite.journal.records", "multisite.journal.segments"} <= mods
