"""The catalog and containers as real processes over TCP on 127.0.0.1: placement from a grid.toml, loss
of a SIGKILLed container (promotion, replacement, status), a catalog restart that keeps the placement,
and a container of another grid refused."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from multisite.cli.main import cli
from multisite.errors import ServerError, WrongGrid
from multisite.instance.layout import INSTANCE_FILE
from multisite.net import control
from multisite.grid.server.process import catalog_routes, catalog_status, start_catalog, start_container, stop_process

HEARTBEAT_TIMEOUT_S = 1.0
GRID_TOML = """
name = "orders"
partitions = 8
min_sync = 1
max_sync = 1
max_async = 1
[maps.m]
"""


class Grid:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.toml = root / "grid.toml"
        self.toml.write_text(GRID_TOML)
        self.dirs: list[Path] = []
        self.address = "127.0.0.1:0"

    def start_catalog(self) -> None:
        info = start_catalog(self.root / "catalog", self.toml, self.address, HEARTBEAT_TIMEOUT_S)
        self.address = info["listen"]  # a restart takes the same port
        if self.root / "catalog" not in self.dirs:
            self.dirs.append(self.root / "catalog")

    def start_container(self, name: str, **kw) -> dict:
        d = self.root / name
        self.dirs.append(d)
        return start_container(d, self.address, "127.0.0.1:0", name=name, **kw)

    def status(self) -> dict:
        return catalog_status(self.address)

    def pid(self, name: str) -> int:
        return json.loads((self.root / name / "run" / "container.json").read_text())["pid"]

    def stop_all(self) -> None:
        for d in self.dirs:
            for what in ("container", "catalog"):
                if (d / "run" / f"{what}.json").exists() and control.is_running(d):
                    try:
                        stop_process(d, what)
                    except ServerError:
                        pass


@pytest.fixture
def grid(tmp_path, request):
    g = Grid(tmp_path)
    yield g
    g.stop_all()
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        for f in sorted(tmp_path.glob("*/log/*.log")):
            print(f"===== {f.relative_to(tmp_path)} (last 30 lines)")
            print("\n".join(f.read_text(errors="replace").splitlines()[-30:]))


def wait_for(what, check, timeout_s=15.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def settled(grid: Grid):
    """The status once every sync replica is current and every container applied the placement."""
    st = grid.status()
    up = [c for c in st["containers"] if c["up"]]
    if not all(set(p["sync"]) == set(p["current"]) for p in st["partitions"]):
        return None
    if not all(c["applied_version"] == st["version"] for c in up):
        return None
    return st


def test_catalog_places_loses_promotes_restarts_and_refuses(grid):
    grid.start_catalog()
    for n in ("c1", "c2", "c3"):
        assert grid.start_container(n)["registered"]
    st = wait_for("a settled placement on three containers", lambda: (s := settled(grid)) and not s["under_replicated"] and s)

    # every partition placed in full, no two shards of one partition in one container
    for p in st["partitions"]:
        shards = [p["primary"], *p["sync"], *p["async"]]
        assert len(p["sync"]) == 1 and len(p["async"]) == 1 and None not in shards
        assert len(set(shards)) == 3, p
        for c in shards:  # each shard is an instance on its container's disk
            assert (grid.root / c / f"orders-p{p['partition']}" / INSTANCE_FILE).is_file()
    assert {c["name"]: c["up"] for c in st["containers"]} == {"c1": True, "c2": True, "c3": True}
    assert max(c["primaries"] for c in st["containers"]) <= 4  # primaries evened out, not all on c1

    # SIGKILL the container with the most primaries: after the heartbeat timeout the catalog promotes
    victim = max(st["containers"], key=lambda c: (c["primaries"], c["name"]))["name"]
    lost_primaries = [p["partition"] for p in st["partitions"] if p["primary"] == victim]
    assert lost_primaries
    os.kill(grid.pid(victim), signal.SIGKILL)
    killed_at = time.monotonic()

    def after_loss():
        s = grid.status()
        down = {c["name"]: c["up"] for c in s["containers"]}
        if down[victim] or any(victim in [p["primary"], *p["sync"], *p["async"]] for p in s["partitions"]):
            return None
        return s

    st2 = wait_for("the loss of the killed container", after_loss)
    # detected by heartbeat, not before: its last one came at most one interval (timeout / 4) before the kill
    assert time.monotonic() - killed_at >= HEARTBEAT_TIMEOUT_S * 0.7
    for p in st2["partitions"]:
        assert p["primary"] and p["primary"] != victim and len(p["sync"]) == 1  # the async replica took sync over
        assert p["primary"] != p["sync"][0]
    for i in lost_primaries:
        assert st2["partitions"][i]["epoch"] > st["partitions"][i]["epoch"]  # a promotion: clients re-route
    short = st2["under_replicated"]
    assert {u["partition"] for u in short} == set(range(8))
    assert all(u["role"] == "async" and "only 2 container(s) are up" in u["reason"] for u in short)
    log = (grid.root / "catalog" / "log" / "catalog.log").read_text()
    assert f"container {victim} lost" in log and "promote partition" in log
    st2 = wait_for("the survivors to apply the new placement", lambda: settled(grid))
    survivor = st2["partitions"][lost_primaries[0]]["primary"]
    routes = catalog_routes(grid.address)  # what a client will ask: the new primary's address, a new epoch
    addresses = {c["name"]: c["address"] for c in st2["containers"]}
    assert routes.version == st2["version"]
    for p in st2["partitions"]:
        r = routes.route(p["partition"])
        assert r.primary == addresses[p["primary"]] and r.epoch == p["epoch"]
    cst = control.call(grid.root / survivor, "status")
    assert cst["shards"][str(lost_primaries[0])]["role"] == "primary"
    over_tcp = catalog_status(addresses[survivor])  # a container answers a StatusRequest on its --listen
    assert over_tcp["name"] == survivor and over_tcp["shards"] == cst["shards"]

    # the catalog restarts: the same placement, the killed container still down
    stop_process(grid.root / "catalog", "catalog")
    grid.start_catalog()
    time.sleep(HEARTBEAT_TIMEOUT_S * 2)  # the survivors reconnected; the dead one's grace ran out
    st3 = wait_for("the survivors after the restart", lambda: settled(grid))
    assert st3["partitions"] == st2["partitions"] and st3["version"] == st2["version"]
    assert {c["name"]: c["up"] for c in st3["containers"]} == {**{n: True for n in ("c1", "c2", "c3")}, victim: False}
    assert "reloaded placement version" in (grid.root / "catalog" / "log" / "catalog.log").read_text()

    # a container of another grid is refused, with the reason, and takes no part
    with pytest.raises(WrongGrid, match="WRONG_GRID.*belongs to grid 'billing'.*serves grid 'orders'"):
        grid.start_container("stranger", grid="billing")
    assert "stranger" not in {c["name"] for c in grid.status()["containers"]}

    # the same through the command line: the status as a table and as JSON, the refusal as one line
    r = CliRunner().invoke(cli, ["grid", "status", "--catalog", grid.address])
    assert r.exit_code == 0, r.output
    assert "placement" in r.output and "down" in r.output and "under-replicated" in r.output
    r = CliRunner().invoke(cli, ["grid", "status", "--catalog", grid.address, "--json"])
    assert json.loads(r.output)["partitions"] == st3["partitions"]
    r = CliRunner().invoke(cli, ["container", "start", "--catalog", grid.address, "--dir", str(grid.root / "s2"),
                                 "--listen", "127.0.0.1:0", "--grid", "billing"])
    assert r.exit_code == 1 and "error: WRONG_GRID: " in r.output, r.output

    # the killed container comes back (same directory, same name): it takes shards again, reopening its data
    assert grid.start_container(victim)["registered"]
    st4 = wait_for("the grid fully placed again", lambda: (s := settled(grid)) and not s["under_replicated"] and s)
    assert all(c["up"] for c in st4["containers"])
    assert any(victim in p["async"] for p in st4["partitions"])


def test_grid_status_of_no_catalog_is_one_clear_line(tmp_path):
    r = CliRunner().invoke(cli, ["grid", "status", "--catalog", "127.0.0.1:1"])
    assert r.exit_code == 1 and "error: SERVER: cannot reach the catalog at 127.0.0.1:1" in r.output


def test_a_catalog_refuses_to_start_on_a_damaged_or_foreign_state(tmp_path):
    g = Grid(tmp_path)
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "catalog.json").write_text("{not json")
    with pytest.raises(ServerError, match="is not the catalog's state"):
        g.start_catalog()
    (tmp_path / "catalog" / "catalog.json").write_text(json.dumps(
        {"format": 1, "grid": "billing", "partitions": 8, "placement": {}, "members": []}))
    with pytest.raises(ServerError, match="state is of grid 'billing', the policy names grid 'orders'"):
        g.start_catalog()
