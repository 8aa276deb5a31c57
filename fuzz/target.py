"""What a fuzz target is, and what counts as a crash (issue 28).

A target's ``run(data)`` parses ``data`` as untrusted input. Ending in a ``MultisiteError`` (the
project's one error tree: a refusal naming what is wrong) is a pass; any other exception (an
IndexError, KeyError, struct.error, UnicodeDecodeError, RecursionError... leaking out of a parser) is
a crash, and so is an input that takes longer than the engine's time limit (a hang).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from multisite.errors import MultisiteError

MAX_EVENTS = 10_000  # events one input may yield before the target calls it a loop


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]

    def one(self, data: bytes) -> None:
        """Run one input: the project's errors pass, anything else propagates (a crash)."""
        try:
            self.run(data)
        except MultisiteError:
            pass


def chunks(data: bytes, cut: int) -> Iterator[bytes]:
    """``data`` in reads of ``cut`` bytes (0: all at once), as a socket might hand them over."""
    if not cut:
        yield data
        return
    for i in range(0, len(data), cut):
        yield data[i:i + cut]
