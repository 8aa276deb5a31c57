"""Configuration files in TOML: one file may hold the settings of every component a site runs.

Each component's table holds its command's options under the same names as on the command line
(``listen``, ``tls-cert``, ``heartbeat-interval``; ``tls_cert`` is accepted too) and its arguments
under their names (``dir``)::

    [server]                      # multisite server start --config site.toml
    dir = "/data/A"
    listen = "127.0.0.1:7000"
    metrics = "127.0.0.1:9100"

    [receiver]                    # started by `server start`, or: multisite receiver start --config site.toml
    listen = "127.0.0.1:7101"

    [source.B]                    # one table per secondary
    connect = "b.example:7101"
    compress = 3

    [catalog]  [container]  [docserver]  [delivery-agent]  [dashboard]

A relative path in the file (``dir``, ``tls-cert``, ``tls-key``, ``tls-ca``, any file or directory
option) is relative to the file's own directory, not to where the command runs, so that a restart from
the recorded file in another directory reads the same files (``--filter`` is a command, not resolved).
A flag the file sets true is turned off on the command line by its ``--no-...`` form.

This module only reads and checks (no click here): ``load`` parses and checks the top-level tables,
``line_of`` finds where a key is written so that an error names the file and line.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from .errors import ConfigError

SECTIONS = ("server", "receiver", "source", "catalog", "container", "docserver", "delivery-agent", "dashboard")
NAMED_SECTIONS = ("source",)  # tables of tables, one per name: [source.B]


class ConfigFile:
    """A parsed configuration file: its tables and its text (for line numbers)."""

    def __init__(self, path: Path, data: dict[str, Any], text: str):
        self.path, self.data, self.lines = path, data, text.splitlines()

    def where(self, section: str, key: str | None = None) -> str:
        """``FILE:LINE`` of ``key`` in table ``section`` (or of the table's header), ``FILE`` if not found."""
        n = line_of(self.lines, section, key)
        return f"{self.path}:{n}" if n else str(self.path)

    def table(self, section: str) -> dict[str, Any] | None:
        """The table ``section`` (dotted for a named one: ``source.B``), None when the file has none."""
        node: Any = self.data
        for part in section.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(f"{self.where(section)}: {section} must be a table ([{section}]), got {node!r:.60}")
        return node

    def names(self, section: str) -> list[str]:
        """The names of a named section's tables (``[source.B]``, ``[source.C]`` -> ``["B", "C"]``)."""
        t = self.data.get(section)
        return sorted(t) if isinstance(t, dict) else []


def load(path: str | Path) -> ConfigFile:
    """Read and parse ``path``; every top-level key must be a known component table."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read the configuration file {p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8 (found by fuzzing: the error leaked, with a traceback)
        raise ConfigError(f"{p}: not valid TOML: not UTF-8 at byte {e.start}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    cfg = ConfigFile(p, data, text)
    for key, value in data.items():
        if key not in SECTIONS:
            raise ConfigError(f"{cfg.where(key) if line_of(cfg.lines, key) else cfg.where('', key)}: unknown "
                              f"table {key!r}; the tables are {', '.join(SECTIONS)}")
        if not isinstance(value, dict):
            raise ConfigError(f"{cfg.where('', key)}: {key} must be a table ([{key}]), got {value!r:.60}")
        if key in NAMED_SECTIONS:
            for name, t in value.items():
                if not isinstance(t, dict):
                    raise ConfigError(f"{cfg.where(key, name)}: [{key}] holds one table per name, as "
                                      f"[{key}.{name}]; got {name} = {t!r:.60}")
    return cfg


_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")


def _norm(dotted: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in dotted.split("."))


def line_of(lines: list[str], section: str, key: str | None = None) -> int | None:
    """1-based line of ``key = ...`` in table ``section`` ("" for the top level), or of the table's
    header when ``key`` is None. A small scan, enough for the files people write (one key a line)."""
    current = ""
    if key is None:
        for i, line in enumerate(lines, 1):
            m = _HEADER.match(line)
            if m and _norm(m.group(1)) == section:
                return i
        return None
    pat = re.compile(r"^\s*(?:" + re.escape(key) + r"|\"" + re.escape(key) + r"\"|'" + re.escape(key) + r"')\s*=")
    for i, line in enumerate(lines, 1):
        m = _HEADER.match(line)
        if m:
            current = _norm(m.group(1))
            continue
        if current == section and pat.match(line):
            return i
    return None
