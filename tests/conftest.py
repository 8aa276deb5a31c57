"""Fixtures every tier may use: the test's outcome on its node (for fixtures that print logs of a
failed test), grids of real processes, a throwaway PostgreSQL server and a 3-member etcd."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from multisite.testing.grid import GridCluster
from multisite.testing.postgres import PostgresServer, pg_bindir


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
