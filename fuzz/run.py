"""Fuzz every parser of multisite (``make fuzz``; issue 28), one target at a time in a process of its own.

    python -m fuzz.run --list
    python -m fuzz.run --runs 1000000 [--engine atheris|mutate] [TARGET ...]

With atheris (a coverage-guided fuzzer over libFuzzer, ``pip install atheris``) each target runs under
libFuzzer with a corpus started from the target's seeds in ``OUT/TARGET/corpus`` (kept between runs),
``-timeout`` for hangs, and the first crash's input in ``OUT/TARGET/``. Without atheris, the seeded
mutation fuzzer of ``mutate.py`` runs instead. Each target's log is ``OUT/TARGET.log``; the summary
(inputs run, seconds, crashes) is printed and written to ``OUT/summary.json``. Run it at low priority
(``nice -n 19``): it takes a core per target for minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HANG_S = 10


def targets() -> dict:
    from fuzz.targets_couch import TARGETS as couch
    from fuzz.targets_files import TARGETS as files
    from fuzz.targets_wire import TARGETS as wires
    return {**wires, **files, **couch}


def _child_atheris(name: str, runs: int, out: Path) -> None:
    import atheris

    with atheris.instrument_imports(include=["multisite", "fuzz"]):  # coverage of the project's code only
        t = targets()[name]
    corpus = out / name / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(t.seeds()):
        (corpus / f"seed-{i}").write_bytes(s)
    atheris.Setup([sys.argv[0], str(corpus), f"-runs={runs}", f"-timeout={HANG_S}", "-max_len=65536",
                   f"-artifact_prefix={out / name}/", "-print_final_stats=1", "-rss_limit_mb=2048"], t.one)
    atheris.Fuzz()


def _child_mutate(name: str, runs: int, out: Path, seed: int) -> None:
    from fuzz.mutate import fuzz

    t0 = time.monotonic()
    res = fuzz(targets()[name], runs, seed, out, HANG_S)
    print(f"Done {res['runs']} runs in {time.monotonic() - t0:.0f} second(s); crashes: {json.dumps(res['crashes'])}")
    sys.exit(1 if res["crashes"] else 0)


def _run_one(name: str, args, out: Path) -> dict:
    log = out / f"{name}.log"
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "fuzz.run", "--child", name, "--runs", str(args.runs), "--engine", args.engine,
           "--seed", str(args.seed), "--out", str(out)]
    scratch = tempfile.mkdtemp(prefix="multisite-fuzz-", dir=os.environ.get("FUZZ_TMP", "/dev/shm"))
    try:  # the child's files (libFuzzer ends it with exit(): no atexit runs there)
        with open(log, "w") as f:
            env = {**os.environ, "FUZZ_TMP": scratch}
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = log.read_text(errors="replace")
    done = re.findall(r"Done (\d+) runs in (\d+) second", text)
    runs = int(done[-1][0]) if done else max([int(n) for n in re.findall(r"#(\d+)\s", text)] or [0])
    return {"target": name, "engine": args.engine, "runs": runs, "seconds": round(time.monotonic() - t0),
            "exit": rc, "crashed": rc != 0, "log": str(log)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="TARGET")
    p.add_argument("--runs", type=int, default=1_000_000)
    p.add_argument("--engine", choices=("auto", "atheris", "mutate"), default="auto")
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--out", default=os.environ.get("FUZZ_OUT", "/tmp/multisite-fuzz"))
    p.add_argument("--list", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.engine == "auto":
        try:
            import atheris  # noqa: F401
            args.engine = "atheris"
        except ImportError:
            args.engine = "mutate"
    if args.child:
        (_child_atheris(args.child, args.runs, out) if args.engine == "atheris"
         else _child_mutate(args.child, args.runs, out, args.seed))
        return
    names = args.names or sorted(targets())
    if args.list:
        print("\n".join(names))
        return
    results = []
    for name in names:
        r = _run_one(name, args, out)
        results.append(r)
        print(f"{name:24} {r['engine']:8} {r['runs']:>10,} inputs {r['seconds']:>6} s  "
              f"{'CRASH (see ' + r['log'] + ')' if r['crashed'] else 'no crash'}", flush=True)
    (out / "summary.json").write_text(json.dumps(results, indent=1))
    sys.exit(1 if any(r["crashed"] for r in results) else 0)


if __name__ == "__main__":
    main()
