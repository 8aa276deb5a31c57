"""cli/output.py's console: unbounded when its output is not a terminal (whatever COLUMNS says); on a
narrow terminal a table shrinks its other columns before an identifier column, and never cuts one with an
ellipsis."""

from __future__ import annotations

import io

from multisite.cli import output
from multisite.cli.output import CliConsole

UNID = "0006615c0fe9468fbb3a7e5d29c1f4b7"
PATH = "/tmp/" + "/".join(f"a-directory-deep-enough-{i}" for i in range(4)) + "/A/log/server.log"


def printed(console: CliConsole, monkeypatch, *args, **kw) -> str:
    monkeypatch.setattr(output, "console", console)
    output.table(*args, **kw)
    return console.file.getvalue()


def test_a_pipe_is_never_wrapped_whatever_columns_says(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    c = CliConsole(file=io.StringIO())
    assert not c.is_terminal and c.width == output.UNWRAPPED_WIDTH
    c.print(f"instance server started: pid 1, log {PATH}")
    c.log(f"archived {PATH}")
    lines = c.file.getvalue().splitlines()
    assert len(lines) == 2 and all(PATH in ln for ln in lines)
    assert all(len(ln) < 300 for ln in lines)  # a log line is not padded to the unbounded width


def test_a_table_in_a_pipe_keeps_every_cell_on_its_line(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    out = printed(CliConsole(file=io.StringIO()), monkeypatch, "documents", ["unid", "form", "fields"],
                  [(UNID, "Memo", '{"subject": "a subject long enough to push the row past eighty columns"}')],
                  whole=["unid"])
    row = [ln for ln in out.splitlines() if UNID in ln]
    assert len(row) == 1 and "past eighty columns" in row[0] and "…" not in out


def test_a_narrow_terminal_folds_the_other_columns_and_keeps_identifiers_whole(monkeypatch):
    c = CliConsole(file=io.StringIO(), force_terminal=True, width=60, color_system=None)
    out = printed(c, monkeypatch, "documents", ["unid", "form", "path", "fields"],
                  [(UNID, "Memo", "/data/A", "a long text " * 8)], whole=["unid", "path"])
    assert max(len(ln) for ln in out.splitlines()) <= 60
    assert any(UNID in ln and "/data/A" in ln for ln in out.splitlines()) and "…" not in out


def test_text_on_a_terminal_is_left_to_the_terminal_to_wrap(monkeypatch):
    c = CliConsole(file=io.StringIO(), force_terminal=True, width=40, color_system=None)
    c.print(f"log {PATH}")
    assert PATH in c.file.getvalue()  # soft wrap: one line the terminal folds, and copies whole
