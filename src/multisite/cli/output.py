"""Shared CLI helpers: rich tables for people, stable JSON for scripts, and option types that refuse
bad values (a port out of range, a nan timeout, an empty name) at the command line, before any server
or Spark sees them, as the one-line ``error: CONFIG: …`` naming the option."""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Iterable

import click
from rich.console import Console
from rich.table import Table

from ..errors import ConfigError
from ..instance.instance_file import valid_name
from ..keys import check_key
from ..net.tls import parse_hostport

console = Console()

# Sizes are given in MiB; past 1 TiB a setting is a typo (and past 2**44 MiB it no longer fits the
# instance file's 64-bit field: a failure after the instance directory was made).
MAX_MIB = 1024 * 1024
# A socket timeout is a C time value: far beyond any real wait and below what settimeout accepts.
MAX_SECONDS = 7 * 24 * 3600.0


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*[str(x) for x in r])
    console.print(t)


def _fail(param, message: str):
    opt = param.opts[0] if param is not None and param.opts else "value"
    raise ConfigError(f"{opt}: {message}")


class HostPort(click.ParamType):
    """HOST:PORT with a port in range (0 allowed where the OS picks one: a listen address)."""

    name = "HOST:PORT"

    def __init__(self, *, listen: bool = False):
        self.min_port = 0 if listen else 1

    def convert(self, value, param, ctx):
        try:
            _, port = parse_hostport(value)  # the form, and ports past 65535
        except ConfigError as e:
            _fail(param, e.message)
        if port < self.min_port:
            _fail(param, f"port {port} of {value!r} is not in {self.min_port}..65535")
        return value


class Seconds(click.ParamType):
    """A finite duration in seconds, above zero (``positive``) or at least zero, at most MAX_SECONDS."""

    name = "SECONDS"

    def __init__(self, *, positive: bool = True):
        self.positive = positive

    def convert(self, value, param, ctx):
        try:
            s = float(value)
        except (TypeError, ValueError):
            _fail(param, f"{value!r} is not a number of seconds")
        low_ok = s > 0 if self.positive else s >= 0
        if not (math.isfinite(s) and low_ok and s <= MAX_SECONDS):
            bound = "above 0" if self.positive else "0 or more"
            _fail(param, f"{value!r} must be a number of seconds {bound} and at most {MAX_SECONDS:.0f}")
        return s


class Name(click.ParamType):
    """An instance name (of a secondary): letters, digits, '-', '_' or '.', as ``instance create`` takes."""

    name = "NAME"

    def convert(self, value, param, ctx):
        if not valid_name(value):
            _fail(param, f"instance name {value!r} must be letters, digits, '-', '_' or '.'")
        return value


class KeyArg(click.ParamType):
    """A key as a JSON list of str and int (``'["acct", 42]'``), or in the text form the CLI prints
    (``("acct",42)``); returned as a checked tuple."""

    name = "KEY"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        text = value.strip()
        if text.startswith("(") and text.endswith(")"):
            text = "[" + text[1:-1] + "]"
        try:
            key = json.loads(text)
        except ValueError:
            key = None
        if not isinstance(key, list):
            raise ConfigError(f"KEY {value!r} is not a key: give it as a JSON list of strings and integers, "
                              f"e.g. '[\"acct\", 42]'")
        return check_key(key)  # KeyTypeError names the subscript that is wrong
