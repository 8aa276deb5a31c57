"""Journal records in readable form (a journal extract): dicts for JSON, lines for people."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import msgspec

from ..keys import key_text
from .records import OP_NAMES, Record


def _doc(vb: bytes | None) -> Any:
    return None if vb is None else msgspec.msgpack.decode(vb)


def record_to_dict(rec: Record) -> dict:
    ups = []
    for u in rec.updates:
        d: dict[str, Any] = {"op": OP_NAMES[u.op], "region": u.region, "key": list(u.key)}
        if u.op == 1:
            d["value"] = _doc(u.value)
            d["before"] = _doc(u.before)
        elif u.op == 3:
            d["before"] = _doc(u.before)
        else:
            d["killed"] = [[list(k), _doc(v)] for k, v in (u.killed or [])]
        ups.append(d)
    return {"seqno": rec.seqno, "stream": rec.stream, "stream_seqno": rec.stream_seqno, "origin": rec.origin,
            "time": rec.time, "updates": ups}


def _j(v: Any) -> str:
    return json.dumps(v, default=repr, ensure_ascii=False, separators=(",", ":"))


def record_lines(rec: Record) -> list[str]:
    when = dt.datetime.fromtimestamp(rec.time).isoformat(sep=" ", timespec="milliseconds")
    head = (f"TXN seqno={rec.seqno} stream={rec.stream}:{rec.stream_seqno} origin={rec.origin} "
            f"time={when} updates={len(rec.updates)}")
    out = [head]
    for u in rec.updates:
        ref = f"{u.region}{key_text(u.key)}"
        if u.op == 1:
            out.append(f"  SET   {ref}={_j(_doc(u.value))}  before={_j(_doc(u.before))}")
        elif u.op == 3:
            out.append(f"  ZKILL {ref}  before={_j(_doc(u.before))}")
        else:
            out.append(f"  KILL  {ref}  removed={len(u.killed or [])} node(s)")
            for k, v in u.killed or []:
                out.append(f"        {u.region}{key_text(tuple(k))}={_j(_doc(v))}")
    return out
