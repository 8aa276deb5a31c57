"""A seeded mutation fuzzer, for machines where atheris does not install (issue 28): inputs made from
the seeds by bit flips, interesting values, inserted, deleted and repeated ranges, splices of two
inputs and truncation; an input that raised nothing joins the pool when it is new in size (a cheap
stand-in for coverage). A crash is saved and counted and the run goes on; an input running past
``timeout_s`` is a hang (SIGALRM)."""

from __future__ import annotations

import hashlib
import random
import signal
import traceback
from pathlib import Path

from fuzz.target import Target

INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF]
MAX_POOL = 2048
MAX_LEN = 65536


class Hang(Exception):
    pass


def mutate(rng: random.Random, data: bytes, other: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        n = len(b)
        if op == 0 and n:
            b[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            v, width = rng.choice(INTERESTING), rng.choice((1, 2, 4))
            at = rng.randrange(n)
            b[at:at + width] = (v & ((1 << 8 * width) - 1)).to_bytes(width, rng.choice(("little", "big")))
        elif op == 2:
            at = rng.randrange(n + 1)
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 3 and n:
            at = rng.randrange(n)
            del b[at:at + rng.randint(1, 32)]
        elif op == 4 and n:
            at, size = rng.randrange(n), rng.randint(1, 64)
            b[at:at] = b[at:at + size] * rng.randint(1, 8)
        elif op == 5 and other:
            cut = rng.randrange(len(other) + 1)
            b = b[:rng.randrange(n + 1)] + bytearray(other[cut:])
        elif op == 6 and n:
            del b[rng.randrange(n):]
    return bytes(b[:MAX_LEN])


def fuzz(target: Target, runs: int, seed: int, out: Path, timeout_s: float = 10.0) -> dict:
    """Run ``runs`` inputs; a summary (runs, crashes by kind, where the crashing inputs went)."""
    rng = random.Random(seed)
    pool = list(target.seeds())
    sizes = {len(p) for p in pool}
    crashes: dict[str, str] = {}

    def alarm(*_):
        raise Hang(f"an input ran past {timeout_s} s")

    signal.signal(signal.SIGALRM, alarm)
    for i in range(runs):
        data = mutate(rng, rng.choice(pool), rng.choice(pool)) if i >= len(pool) else pool[i]
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            target.one(data)
        except Exception as e:  # noqa: BLE001 - a crash: anything outside the project's error tree
            signal.setitimer(signal.ITIMER_REAL, 0)
            tb = traceback.extract_tb(e.__traceback__)[-1]
            kind = f"{type(e).__name__} at {Path(tb.filename).name}:{tb.lineno}"
            if kind not in crashes:
                path = out / f"crash-{target.name}-{hashlib.sha1(data).hexdigest()[:12]}"
                path.write_bytes(data)
                crashes[kind] = str(path)
                print(f"CRASH {kind}: {e!r:.200} (input {path})\n{traceback.format_exc()}", flush=True)
            continue
        signal.setitimer(signal.ITIMER_REAL, 0)
        if len(data) not in sizes and len(pool) < MAX_POOL:
            sizes.add(len(data))
            pool.append(data)
    return {"runs": runs, "crashes": crashes}
