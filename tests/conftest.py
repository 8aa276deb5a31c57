"""Fixtures every tier may use: the test's outcome on its node (for fixtures that print logs of a
failed test), grids of real processes, a throwaway PostgreSQL server and a 3-member etcd."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from multisite.testing.grid import GridCluster
from multisite.testing.postgres import PostgresServer, pg_bindir


# The files a fresh-clone `make test` measured slowest, longest first (issue 29). xdist's loadfile hands
# out files in collection order (the Makefile turns its by-test-count reorder off), so these start
# first and the short files fill in around them; listed last, three single-test files of about 3
# minutes each ran side by side at the end while nothing else was left. Order only: nothing is skipped.
SLOW_FIRST = (
    "tests/integration/test_demo.py",
    "tests/spark/test_cluster.py",
    "tests/spark/test_quiet_start.py",
    "tests/faults/test_grid_loader_kills.py",
    "tests/spark/test_export_rollback_cases.py",
    "tests/spark/test_source.py",
    "tests/faults/test_ha_rounds.py",
    "tests/faults/test_grid_etcd_rounds.py",
    "tests/faults/test_failover_random.py",
    "tests/faults/test_delivery_faults.py",
)


def pytest_collection_modifyitems(items):
    """Move the tests of ``SLOW_FIRST``'s files to the front, in its order (a stable sort: the rest, and
    each file's own tests, keep their order)."""
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def failed(request) -> bool:
    return getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed


@pytest.fixture
def make(tmp_path, request):
    """Makes ``GridCluster``s in the test's directory; every process is stopped afterwards, and their
    logs are printed when the test failed."""
    made: list[GridCluster] = []

    def factory(**kw) -> GridCluster:
        g = GridCluster(tmp_path / f"g{len(made)}", **kw)
        made.append(g)
        return g
    yield factory
    for g in made:
        g.stop_all()
        if failed(request):
            for f in sorted(g.root.glob("*/log/*.log")):
                print(f"===== {f.relative_to(g.root)} (last 25 lines)")
                print("\n".join(f.read_text(errors="replace").splitlines()[-25:]))


@pytest.fixture(scope="module")
def pg():
    """A throwaway PostgreSQL server for the module's tests (`make setup` installs the binaries)."""
    if pg_bindir() is None:
        pytest.skip("no PostgreSQL binaries: run `make setup`")
    d = tempfile.mkdtemp(prefix="ms-pg-")
    os.chmod(d, 0o755)
    s = PostgresServer(Path(d) / "pg").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory):
    """A real 3-member etcd on loopback, shared by a module's tests (each uses its own cluster name)."""
    from multisite.testing.etcd import EtcdCluster

    with EtcdCluster(tmp_path_factory.mktemp("etcd")) as etcd:
        yield etcd
