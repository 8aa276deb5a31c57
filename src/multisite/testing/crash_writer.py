"""A writer process for crash tests and the demo: commits in a loop and reports each acknowledged seqno.

    python -m multisite.testing.crash_writer DIR [--durability MODE] [--count N] [--start I]

Transaction ``i`` sets ``("w", i)`` and ``("w2", i)`` in region ``crash`` (two updates, so a partial
transaction would be visible as one key without the other) and, after ``commit`` returns, prints
``ACK <seqno> <i>`` and flushes. Whoever kills this process knows every line it read was acknowledged.
"""

from __future__ import annotations

import argparse
import sys

import multisite


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--durability", default=None)
    ap.add_argument("--count", type=int, default=10**9)
    ap.add_argument("--start", type=int, default=None)
    ap.add_argument("--payload", type=int, default=64)
    a = ap.parse_args(argv)
    db = multisite.open(a.dir, durability=a.durability)
    db.create_region("crash")
    start = a.start if a.start is not None else db.seqno + 1
    out = sys.stdout
    print(f"READY {db.seqno}", file=out, flush=True)
    pad = "x" * a.payload
    for i in range(start, start + a.count):
        with db.transaction() as tx:
            tx.set("crash", ("w", i), {"i": i, "pad": pad})
            tx.set("crash", ("w2", i), i)
        out.write(f"ACK {tx.seqno} {i}\n")
        out.flush()
    db.close()
    print("DONE", file=out, flush=True)


if __name__ == "__main__":
    main()
