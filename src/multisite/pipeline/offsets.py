"""Stream offsets: the last seqno consumed per instance, one value type with one JSON form.

``{"seqno": {"A": 120, "B": 7}, "crc": {"A": 3735928559}}``: every transaction of instance A up
to seqno 120 (inclusive) is in the batches up to this offset, and the payload CRC of A's record 120
was 3735928559 when the offset was taken. The same form is what Spark stores in its checkpoint's
offset log. The CRC lets a restarted stream notice that the instance was rolled back under it (the
record at that seqno is gone, or another one took its place); it is absent where there was no record
to take it from (a stream starting before the first seqno) and in offsets written before it existed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class JournalOffset:
    seqnos: tuple[tuple[str, int], ...]  # sorted (instance name, last seqno)
    crcs: tuple[tuple[str, int], ...] = ()  # sorted (instance name, payload CRC of that record)

    @classmethod
    def of(cls, mapping: dict[str, int], crcs: dict[str, int | None] | None = None) -> "JournalOffset":
        return cls(tuple(sorted((str(k), int(v)) for k, v in mapping.items())),
                   tuple(sorted((str(k), int(v)) for k, v in (crcs or {}).items() if v is not None)))

    @classmethod
    def from_dict(cls, d: dict) -> "JournalOffset":
        return cls.of(d["seqno"], d.get("crc"))

    @classmethod
    def parse(cls, text: str) -> "JournalOffset":
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> dict:
        out: dict = {"seqno": dict(self.seqnos)}
        if self.crcs:
            out["crc"] = dict(self.crcs)
        return out

    def __str__(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def get(self, name: str, default: int = 0) -> int:
        return dict(self.seqnos).get(name, default)

    def crc(self, name: str) -> int | None:
        return dict(self.crcs).get(name)
