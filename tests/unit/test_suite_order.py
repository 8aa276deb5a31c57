"""The suite's own scheduling list (tests/conftest.py's SLOW_FIRST) names files that exist: a renamed
file would silently drop back among the short ones and end CI alone again."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _slow_first() -> list[str]:
    """SLOW_FIRST read from tests/conftest.py's source (several conftest modules share the name)."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["SLOW_FIRST"]:
            return list(ast.literal_eval(node.value))
    raise AssertionError("tests/conftest.py has no SLOW_FIRST")


def test_every_slow_first_file_exists_and_is_listed_once():
    slow = _slow_first()
    assert len(set(slow)) == len(slow) > 0
    missing = [p for p in slow if not (ROOT / p).is_file()]
    assert not missing, f"tests/conftest.py's SLOW_FIRST names files that do not exist: {missing}"
