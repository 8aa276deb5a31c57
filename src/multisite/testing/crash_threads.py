"""A many-threaded writer for crash tests of ``group`` mode: concurrent commits share fsyncs.

    python -m multisite.testing.crash_threads DIR [--threads N] [--durability MODE]

Thread ``t`` commits transactions ``n = 0, 1, 2, ...``, each setting ``("t", t, n)`` and
``("t2", t, n)`` in region ``crash``; after ``commit`` returns it prints ``ACK <seqno> <t> <n>``
(one write per line, under a lock, flushed). A thread's transactions are committed one after the
other, so after any crash the ``n`` present for a thread must be ``0..m`` with no hole.
"""

from __future__ import annotations

import argparse
import sys
import threading

import multisite


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--durability", default="group")
    a = ap.parse_args(argv)
    db = multisite.open(a.dir, durability=a.durability)
    db.create_region("crash")
    out, out_lock = sys.stdout, threading.Lock()
    go = threading.Event()

    def writer(t: int) -> None:
        n = 0
        while db.get("crash", ("t", t, n)) is not None:  # resume after an earlier round's crash
            n += 1
        go.wait()
        while True:
            with db.transaction() as tx:
                tx.set("crash", ("t", t, n), {"t": t, "n": n})
                tx.set("crash", ("t2", t, n), n)
            with out_lock:
                out.write(f"ACK {tx.seqno} {t} {n}\n")
                out.flush()
            n += 1

    threads = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(a.threads)]
    for th in threads:
        th.start()
    print(f"READY {db.seqno}", file=out, flush=True)
    go.set()
    for th in threads:
        th.join()


if __name__ == "__main__":
    main()
