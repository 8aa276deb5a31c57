"""Shared CLI helpers: rich tables for people, stable JSON for scripts, and option types that refuse
bad values (a port out of range, a nan timeout, an empty name) at the command line, before any server
or Spark sees them, as the one-line ``error: CONFIG: …`` naming the option.

Output is made to be copied: what is not a terminal (a pipe, a file, a log, a test) is never wrapped nor
cut, whatever ``COLUMNS`` says, so ``grep`` finds a path or an identifier on one line. On a terminal,
text is not wrapped by rich either (the terminal soft-wraps it, and copies it as one line), and a table
that is too wide shrinks its other columns first and folds, never ends an identifier, an address or a
path with an ellipsis."""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Iterable

import click
from rich.console import Console, ConsoleDimensions
from rich.table import Table

from ..errors import ConfigError
from ..instance.instance_file import valid_name
from ..keys import check_key
from ..net.tls import parse_hostport

# The width of output that is not a terminal: no line of a table or a message is near it, so nothing
# wraps; nothing the CLI prints expands to the full width (log lines are printed as plain text below).
UNWRAPPED_WIDTH = 1 << 20


class CliConsole(Console):
    """rich's console, unwrapped when its output is not a terminal (rich would take 80 columns there, or
    ``COLUMNS``, and break a log path or an UNID across lines), and soft-wrapped on a terminal."""

    def __init__(self, **kwargs):
        kwargs.setdefault("soft_wrap", True)
        super().__init__(**kwargs)

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        return dims if self.is_terminal else ConsoleDimensions(UNWRAPPED_WIDTH, dims.height)

    @size.setter
    def size(self, new_size) -> None:
        Console.size.fset(self, new_size)

    def log(self, *objects, **kwargs) -> None:
        """A progress line with its time; outside a terminal a plain one (rich's log pads every line to
        the console's width and adds the caller's file)."""
        if self.is_terminal:
            kwargs.setdefault("_stack_offset", 2)
            return super().log(*objects, **kwargs)
        stamp = self.get_datetime().strftime("[%X]")
        self.print(stamp, *objects, markup=kwargs.get("markup"), highlight=False)


console = CliConsole()

# Sizes are given in MiB; past 1 TiB a setting is a typo (and past 2**44 MiB it no longer fits the
# instance file's 64-bit field: a failure after the instance directory was made).
MAX_MIB = 1024 * 1024
# A socket timeout is a C time value: far beyond any real wait and below what settimeout accepts.
MAX_SECONDS = 7 * 24 * 3600.0


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]], *, whole: Iterable[str] = ()) -> None:
    """Print rows under ``columns``. The ``whole`` columns (identifiers, addresses, paths: what a user
    copies into the next command) are not wrapped: a narrow terminal shrinks the other columns first,
    and only past that folds them onto a second line. No column ever ends in an ellipsis."""
    columns, keep = list(columns), set(whole)
    assert keep <= set(columns), f"whole columns {keep - set(columns)} are not columns of {title!r}"
    t = Table(title=title)
    for c in columns:
        t.add_column(c, no_wrap=c in keep, overflow="fold")
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
