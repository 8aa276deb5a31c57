"""Example replication filters for tests and the demo, in both forms.

In-process (``--filter multisite.testing.filters:upgrade_person``): functions from a transaction
document to its answer. External (``--filter "python3 …/testing/filters.py upgrade"``, see
``filter_command``): this file run as a script is a filter program reading JSON lines (or msgpack
frames with ``--format msgpack``) on stdin and writing one answer per transaction on stdout. The
script imports nothing from multisite (only msgspec, and only for msgpack), so it starts quickly.

The rolling-upgrade shapes: the old application stores a person as ``{"name": "Ann Lee"}``, the new
one as ``{"first": "Ann", "last": "Lee"}``. ``upgrade_person`` turns old into new (a secondary running
the new application, as its receiver's in-filter), ``downgrade_person`` new into old (a primary
running the new application, as the out-filter of its source to an instance still on the old one).
Both transform values, before-images and a kill's removed values alike.

Fault modes of the script: ``crash-after N`` (exit after N answers), ``hang-after N`` (stop answering
after N), ``extra`` (two answers for the first transaction), ``wrong-seqno``, ``garbage``.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any, Callable

PEOPLE = "people"


def _old_to_new(v: Any) -> Any:
    if isinstance(v, dict) and "name" in v and "first" not in v:
        first, _, last = str(v["name"]).partition(" ")
        v = {k: x for k, x in v.items() if k != "name"}
        v.update(first=first, last=last)
    return v


def _new_to_old(v: Any) -> Any:
    if isinstance(v, dict) and "first" in v and "name" not in v:
        name = f"{v['first']} {v.get('last', '')}".strip()
        v = {k: x for k, x in v.items() if k not in ("first", "last")}
        v["name"] = name
    return v


def _reshape(doc: dict, f: Callable[[Any], Any]) -> dict:
    for u in doc["updates"]:
        if u.get("region") != PEOPLE:
            continue
        for field in ("value", "before"):
            if u.get(field) is not None:
                u[field] = f(u[field])
        if u.get("killed"):
            u["killed"] = [[k, f(v)] for k, v in u["killed"]]
    return doc


def upgrade_person(doc: dict) -> dict:
    """Old shape to new in region ``people``."""
    return _reshape(doc, _old_to_new)


def downgrade_person(doc: dict) -> dict:
    """New shape to old in region ``people``."""
    return _reshape(doc, _new_to_old)


def identity(doc: dict) -> dict:
    return doc


def drop_updates(doc: dict) -> dict:
    """Every transaction becomes an empty one (it keeps its seqno)."""
    doc["updates"] = []
    return doc


TRANSFORMS = {"identity": identity, "drop": drop_updates, "upgrade": upgrade_person, "downgrade": downgrade_person}


def filter_command(mode: str, *args: str, fmt: str = "json") -> str:
    """The ``--filter`` command line that runs this file as a filter program."""
    argv = [sys.executable, __file__, mode, *args] + (["--format", fmt] if fmt != "json" else [])
    return shlex.join(argv)


def main(argv: list[str]) -> int:
    import json
    import struct
    import time

    fmt = "json"
    if "--format" in argv:
        i = argv.index("--format")
        fmt = argv[i + 1]
        del argv[i:i + 2]
    mode, n = argv[0], int(argv[1]) if len(argv) > 1 else 0
    transform = TRANSFORMS.get(mode, identity)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    if fmt == "msgpack":
        import msgspec

        def read():
            head = inp.read(4)
            if len(head) < 4:
                return None
            return msgspec.msgpack.decode(inp.read(struct.unpack("<I", head)[0]))

        def write(doc):
            body = msgspec.msgpack.encode(doc)
            out.write(struct.pack("<I", len(body)) + body)
    else:
        def read():
            line = inp.readline()
            return json.loads(line) if line else None

        def write(doc):
            out.write(json.dumps(doc).encode() + b"\n")
    answered = 0
    while (doc := read()) is not None:
        if mode == "crash-after" and answered >= n:
            return 3
        if mode == "hang-after" and answered >= n:
            time.sleep(3600)
        if mode == "slow":  # n ms per transaction: each answer in time, a large batch slow
            time.sleep(n / 1000)
        if mode == "wrong-seqno":
            doc["seqno"] += 1
        if mode == "garbage":
            out.write(b"this is not json\n")
            out.flush()
            continue
        write(transform(doc))
        if mode == "extra" and answered == 0:
            write(doc)
        answered += 1
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
