"""How hard a commit is before it returns: one enum, validated once, used by the writer, the engine
and the CLI (which takes its choices from it)."""

from __future__ import annotations

from enum import Enum

from ..errors import ConfigError


class Durability(str, Enum):
    """``fsync``: each commit is hardened before it returns. ``group``: concurrent commits share one
    write and one fdatasync, each still hard before it returns. ``none``: written to the OS only
    (survives a process crash, not a power cut)."""

    FSYNC = "fsync"
    GROUP = "group"
    NONE = "none"

    @classmethod
    def parse(cls, value: "str | Durability") -> "Durability":
        """The mode named ``value``; a ConfigError naming the choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"durability must be one of {', '.join(CHOICES)}, got {value!r}") from None

    def __str__(self) -> str:
        return self.value


CHOICES = tuple(d.value for d in Durability)
