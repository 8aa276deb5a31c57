"""The layer order of docs/architecture.md, checked on the source: no import points up, none makes a cycle.

The order is written once, in the "Layers" block of docs/architecture.md (lowest first, one layer a
line, several packages of one layer on one line); this test reads it from there. A module may
import modules of its own layer or of lower ones; every import counts, including those inside
functions (a lazy import is still an arrow). Imports between modules must also form no cycle.
The protocol is sans-IO: it imports errors and value types only, and no sockets, asyncio or clock.
The same holds for the listed decision modules of the families (``SANS_IO_ELSEWHERE``).

Each family (``FAMILIES``) is one folder: its core modules decide and import no socket, asyncio,
thread or clock, nor any process code (``net``, the instance ``server``, a family's ``server/``);
only its ``server/`` sub-package does I/O.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import multisite

SRC = Path(multisite.__file__).parent
ARCHITECTURE = SRC.parent.parent / "docs" / "architecture.md"
PROTOCOL_MAY_IMPORT = {"errors", "keys", "values", "journal.records", "protocol"}
PROTOCOL_STDLIB_BANNED = {"socket", "ssl", "asyncio", "selectors", "time", "threading", "subprocess",
                          "concurrent", "multiprocessing"}
# Families: one folder each, the sans-IO core at its top and its processes in ``<family>/server/``.
FAMILIES = {"replication", "grid", "multimaster", "delivery"}
PROCESS_PACKAGES = {"net", "server"}  # and every family's server/ sub-package
# Sans-IO modules outside protocol/, and what each may import besides PROTOCOL_MAY_IMPORT.
SANS_IO_ELSEWHERE = {("replication", "session"): {"instance.instance_file", "replication.history"},
                     ("grid", "wire"): set(),
                     ("ha", "decide"): set(),
                     ("grid", "catalog"): {"grid.placement", "grid.policy", "grid.routing", "grid.wire"},
                     ("grid", "access"): set(),
                     ("grid", "coordination"): {"grid.catalog", "grid.placement", "grid.policy", "grid.routing",
                                                "grid.wire", "ha.decide"},
                     ("multimaster", "ids"): set(),
                     ("multimaster", "document"): {"multimaster.ids"},
                     ("multimaster", "conflicts"): {"multimaster.document", "multimaster.ids"},
                     ("multimaster", "wire"): set(),
                     ("multimaster", "schedule"): set(),
                     ("multimaster", "couch"): {"multimaster.conflicts", "multimaster.document", "multimaster.ids",
                                                "multimaster.couch_atts", "multimaster.couch_errors"},
                     ("multimaster", "couch_errors"): set(),
                     ("multimaster", "couch_atts"): {"multimaster.couch_errors"},
                     ("multimaster", "couch_selector"): {"multimaster.couch_errors"},
                     ("multimaster", "couch_session"): {"multimaster.couch_errors"},
                     ("multimaster", "couch_cors"): set(),
                     ("multimaster", "couch_purge"): {"multimaster.couch", "multimaster.couch_errors",
                                                      "multimaster.document", "multimaster.conflicts",
                                                      "multimaster.couch_atts", "multimaster.ids"},
                     ("multimaster", "session"): {"multimaster.conflicts", "multimaster.document", "multimaster.ids",
                                                  "multimaster.wire"}}


def _layers() -> dict[str, int]:
    """Package (or top-level module) -> its layer's rank, from docs/architecture.md."""
    text = ARCHITECTURE.read_text()
    block = re.search(r"## Layers.*?```text\n(.*?)```", text, re.S)
    assert block, f"{ARCHITECTURE} has no ```text block under '## Layers'"
    ranks: dict[str, int] = {}
    for rank, line in enumerate(ln for ln in block.group(1).splitlines() if ln.strip()):
        for name in re.findall(r"[a-z_]+", line.split("#")[0]):
            ranks[name] = rank
    return ranks


LAYERS = _layers()


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
MODULES = {".".join(parts) for _, parts in CASES}


def _target(mod: str) -> str | None:
    """The module of ours that an import names (``from pkg import name`` may name a module or not)."""
    sub = _sub(mod)
    while sub and sub not in MODULES:
        sub = sub.rpartition(".")[0]
    return sub or None


@pytest.mark.parametrize("path,parts", CASES, ids=[".".join(x) or "multisite" for _, x in CASES])
def test_no_import_points_up(path, parts):
    if not parts:  # the package root is the public facade: it re-exports every layer's API
        return
    top = parts[0]
    assert top in LAYERS, f"{path.relative_to(SRC)}: {top!r} has no layer in {ARCHITECTURE.name}'s Layers block"
    for mod, ours in _imports(path, parts):
        target = _target(mod) if ours else None
        if target is None:
            continue
        dest = target.split(".")[0]
        assert dest in LAYERS, f"{path.relative_to(SRC)} imports {mod}, whose package has no layer"
        assert LAYERS[dest] <= LAYERS[top], (
            f"{path.relative_to(SRC)} (layer {top}) imports {mod} (layer {dest}, higher): arrows point down only")


def test_imports_make_no_cycle():
    graph: dict[str, set[str]] = {}
    for path, parts in CASES:
        me = ".".join(parts)
        deps = graph.setdefault(me, set())
        for mod, ours in _imports(path, parts):
            target = _target(mod) if ours else None
            if target is not None and target != me and not me.startswith(target + ".") and target:
                deps.add(target)  # a package's __init__ imported by its own modules is no cycle
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        path.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                cycle = path[path.index(d):] + [d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        path.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


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


def test_the_walker_sees_relative_and_lazy_imports():
    (path, parts), = [c for c in CASES if c[1] == ["journal", "reader"]]
    mods = {m for m, ours in _imports(path, parts) if ours}
    assert {"multisite.errors", "multisite.journal.records", "multisite.journal.segments"} <= mods
    tree = ast.parse("def f():\n    from ..cli import main\n")
    assert any(isinstance(n, ast.ImportFrom) and n.module == "cli" for n in ast.walk(tree))


def test_the_layers_block_names_every_package():
    tops = {parts[0] for _, parts in CASES if parts}
    assert tops <= set(LAYERS), f"packages with no layer: {sorted(tops - set(LAYERS))}"


FAMILY_CORE = [(p, parts) for p, parts in CASES
               if parts[:1] and parts[0] in FAMILIES and len(parts) > 1 and parts[1] != "server"]


def _is_process_code(sub: str) -> bool:
    """``net.x``, ``server.x`` or ``<family>.server.x``: code that does I/O."""
    parts = sub.split(".")
    return parts[0] in PROCESS_PACKAGES or (parts[0] in FAMILIES and parts[1:2] == ["server"])


@pytest.mark.parametrize("path,parts", FAMILY_CORE, ids=[".".join(x) for _, x in FAMILY_CORE])
def test_family_core_modules_do_no_io(path, parts):
    for mod, ours in _imports(path, parts):
        if ours:
            assert not _is_process_code(_sub(mod)), (
                f"{path.relative_to(SRC)} imports {mod}: a family's core decides; only its server/ does I/O")
        else:
            assert mod.split(".")[0] not in PROTOCOL_STDLIB_BANNED, (
                f"{path.relative_to(SRC)} imports {mod}: no sockets, asyncio, threads or clock in a family's "
                f"core (move the I/O to {parts[0]}/server/)")


def test_every_family_has_its_processes_in_its_folder():
    for family in FAMILIES:
        assert (SRC / family / "server" / "__init__.py").exists(), f"{family}/server/ is missing"
    net = sorted(p.stem for p in (SRC / "net").glob("*.py") if p.stem != "__init__")
    assert net == ["affinity", "control", "metrics", "process", "tls"], (
        f"net/ holds only what several families share; it has {net}")
