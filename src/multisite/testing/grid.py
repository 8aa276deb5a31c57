"""A grid of real processes for tests, benches and the demo: a catalog and containers on 127.0.0.1.

``GridCluster(root, partitions=…, min_sync=…, …)`` writes ``grid.toml``; ``start_catalog()``,
``start_container(name)``, ``kill(name)`` (SIGKILL), ``stop(name)``, ``status()``, ``settled()``
(every partition has a primary, every sync replica current, every container on the placement's
version), ``client()``, and ``shard_states()`` / ``compare()``: the key-by-key state of each
partition's shards, read from their instance directories once the containers are stopped.

With ``etcd`` (endpoints of a ``testing.etcd.EtcdCluster``) the catalogs and containers coordinate
through etcd (issue 24): ``start_catalog(name)`` may run several catalogs (each in ``root/<name>``),
``address`` lists them all, containers register in etcd, and ``leader()`` names the leading catalog.
With ``hosts`` (a ``testing.netns.Hosts``), ``start_catalog`` and ``start_container`` take ``host=``: the
process runs in that namespace, and its control socket is reached from there. With ``pki`` (a
``testing.certs.make_test_pki``) every process gets a member certificate of the grid and every wire is
TLS; ``users`` is the directory of the grid's users.json; the harness itself (status, ``client()``
unless ``client_auth`` says otherwise) uses a member certificate named ``harness``.
"""

from __future__ import annotations

import json
import os
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

from ..engine import open as open_db
from ..errors import ServerError
from ..net import control
from ..grid.server.process import catalog_status, start_catalog, start_container, stop_process


class GridCluster:
    def __init__(self, root: Path, *, name: str = "orders", partitions: int = 4, min_sync: int = 1,
                 max_sync: int = 1, max_async: int = 1, heartbeat_timeout_s: float = 1.0,
                 checkpoint_after: int | None = None, map_settings: str = "", etcd: str | None = None,
                 lease_ttl_s: float | None = None, hosts=None, pki: dict | None = None, users: Path | None = None,
                 insecure: bool = False, client_auth: dict | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.toml = self.root / "grid.toml"
        self.toml.write_text(f'name = "{name}"\npartitions = {partitions}\nmin_sync = {min_sync}\n'
                             f"max_sync = {max_sync}\nmax_async = {max_async}\n[maps.m]\n{map_settings}")
        self.partitions = partitions
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.checkpoint_after = checkpoint_after
        self.etcd, self.lease_ttl_s = etcd, lease_ttl_s
        self.catalogs: dict[str, str] = {}  # name -> address (a restart takes the same port)
        self.containers: list[str] = []
        self.hosts, self.where = hosts, {}  # process name -> network namespace host
        self.pki, self.users, self.insecure = pki, users, insecure
        self.harness_tls = self.member_tls("harness") if pki else None
        self.client_auth = client_auth if client_auth is not None else (
            {"tls_ca": str(self.harness_tls.ca), "tls_cert": str(self.harness_tls.cert),
             "tls_key": str(self.harness_tls.key)} if pki else {})

    def member_tls(self, name: str, grid: str | None = None):
        """A member certificate of this grid (or of ``grid``) named ``name``, as TLS options."""
        from ..net.tls import TLSConfig
        from .certs import make_grid_cert
        c = make_grid_cert(self.pki, name, grid or self.name)
        return TLSConfig(str(c["cert"]), str(c["key"]), str(c["ca"]))

    def _security(self, name: str) -> dict:
        return {"tls": self.member_tls(name) if self.pki else None, "users": self.users, "insecure": self.insecure}

    def _in(self, name: str):
        """The namespace of ``name``'s process for a block (its control socket is reachable from there)."""
        host = self.where.get(name)
        return self.hosts.entered(host) if host is not None else contextlib.nullcontext()

    @property
    def address(self) -> str:
        """Every catalog's address, as clients and ``grid status`` take them."""
        return ",".join(self.catalogs.values()) or "127.0.0.1:0"

    # -- processes --------------------------------------------------------------------------------
    def start_catalog(self, metrics: str | None = None, name: str = "catalog", *, host: str | None = None,
                      listen: str = "127.0.0.1:0") -> str:
        if host is not None:
            self.where[name] = host
        with self._in(name):
            info = start_catalog(self.root / name, self.toml, self.catalogs.get(name, listen),
                                 self.heartbeat_timeout_s, metrics, etcd=self.etcd, name=name if self.etcd else None,
                                 lease_ttl_s=self.lease_ttl_s, **self._security(name))
        self.catalogs[name] = info["listen"]
        return info["listen"]

    def is_catalog(self, name: str) -> bool:
        return name in self.catalogs

    def start_container(self, name: str, *, listen: str = "127.0.0.1:0", advertise: str | None = None,
                        env: dict[str, str] | None = None, metrics: str | None = None,
                        host: str | None = None) -> dict:
        """``env``: variables for this container only (e.g. a loader crash point)."""
        if name not in self.containers:
            self.containers.append(name)
        if host is not None:
            self.where[name] = host
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            with self._in(name):
                return start_container(self.root / name, None if self.etcd else self.address, listen, name=name,
                                       checkpoint_after=self.checkpoint_after, advertise=advertise,
                                       metrics=metrics, etcd=self.etcd, grid=self.name if self.etcd else None,
                                       lease_ttl_s=self.lease_ttl_s, **self._security(name))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def pid(self, name: str) -> int:
        what = "catalog" if self.is_catalog(name) else "container"
        return json.loads((self.root / name / "run" / f"{what}.json").read_text())["pid"]

    def kill(self, name: str) -> None:
        """SIGKILL the container (or ``"catalog"``) ``name`` and wait until it is gone."""
        pid = self.pid(name)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.running(name):
            time.sleep(0.02)
        for f in ("container.json", "catalog.json"):
            (self.root / name / "run" / f).unlink(missing_ok=True)

    def stop(self, name: str) -> None:
        with self._in(name):
            stop_process(self.root / name, "catalog" if self.is_catalog(name) else "container")

    def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` (SIGSTOP, SIGCONT) to a catalog or container."""
        os.kill(self.pid(name), sig)

    def leader(self) -> str | None:
        """The leading catalog's name as the catalogs' status says (with etcd)."""
        return (self.status().get("coordination") or {}).get("leader")

    def running(self, name: str) -> bool:
        with self._in(name):
            return control.is_running(self.root / name)

    def stop_all(self) -> None:
        for name in [*self.containers, *self.catalogs]:
            if self.running(name):
                try:
                    self.stop(name)
                except ServerError:
                    pass

    # -- state ------------------------------------------------------------------------------------
    def status(self) -> dict:
        if self.harness_tls is None:
            return catalog_status(self.address)
        from ..server.client import client_tls_context
        t = self.harness_tls
        return catalog_status(self.address, tls=client_tls_context(t.ca, t.cert, t.key, check_hostname=False))

    def settled(self, status: dict | None = None) -> dict | None:
        st = status or self.status()
        up = {c["name"] for c in st["containers"] if c["up"]}
        for p in st["partitions"]:
            if p["primary"] not in up or set(p["sync"]) != set(p["current"]):
                return None
        if not all(c["applied_version"] == st["version"] for c in st["containers"] if c["up"]):
            return None
        return st

    def wait(self, what: str, check, timeout_s: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            time.sleep(0.05)
        try:
            st = self.status()
            summary = "; ".join(f"p{p['partition']} {p['primary']} sync={p['sync']} current={p['current']} "
                                f"async={p['async']} seqnos={p['seqnos']}" for p in st["partitions"])
            summary += "; " + ", ".join(f"{c['name']} {'up' if c['up'] else 'down'} v{c['applied_version']}"
                                        for c in st["containers"]) + f" (version {st['version']})"
        except Exception as e:  # noqa: BLE001 - only for the message
            summary = f"no status: {e}"
        raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}: {summary}")

    def wait_settled(self, timeout_s: float = 20.0) -> dict:
        return self.wait("a settled grid", self.settled, timeout_s)

    def caught_up(self) -> dict | None:
        """The status once every shard of every partition has its primary's seqno."""
        st = self.settled()
        if st is None:
            return None
        for p in st["partitions"]:
            seqnos = p["seqnos"]
            if p["primary"] not in seqnos or any(seqnos.get(c) != seqnos[p["primary"]]
                                                 for c in [*p["sync"], *p["async"]]):
                return None
        return st

    def client(self, timeout_s: float = 30.0):
        from ..grid.server.client import connect
        return connect(self.address, timeout_s=timeout_s, **self.client_auth)

    def shard_dir(self, container: str, partition: int) -> Path:
        return self.root / container / f"{self.name}-p{partition}"

    def shard_states(self, region: str = "m") -> dict[int, dict[str, dict]]:
        """partition -> container -> {key: value} of every shard on disk (containers stopped)."""
        out: dict[int, dict[str, dict]] = {}
        for c in self.containers:
            for p in range(self.partitions):
                d = self.shard_dir(c, p)
                if not d.exists():
                    continue
                with open_db(d) as db:
                    rows = dict(db.items(region)) if region in db.regions() else {}
                    out.setdefault(p, {})[c] = {"seqno": db.seqno, "rows": rows}
        return out
