"""Stream offsets: the last seqno consumed per instance, one value type with one JSON form.

``{"seqno": {"A": 120, "B": 7}}``: every transaction of instance A up to seqno 120 (inclusive) is
in the batches up to this offset. The same form is what Spark stores in its checkpoint's offset log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class JournalOffset:
    seqnos: tuple[tuple[str, int], ...]  # sorted (instance name, last seqno)

    @classmethod
    def of(cls, mapping: dict[str, int]) -> "JournalOffset":
        return cls(tuple(sorted((str(k), int(v)) for k, v in mapping.items())))

    @classmethod
    def from_dict(cls, d: dict) -> "JournalOffset":
        return cls.of(d["seqno"])

    @classmethod
    def parse(cls, text: str) -> "JournalOffset":
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> dict:
        return {"seqno": dict(self.seqnos)}

    def __str__(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def get(self, name: str, default: int = 0) -> int:
        return dict(self.seqnos).get(name, default)
