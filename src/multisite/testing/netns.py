"""Hosts in network namespaces, joined to one bridge, with links that a test cuts and heals (root only).

    with Hosts("msha", ["e0", "e1", "e2", "A", "B", "C"]) as hosts:   # or Hosts("msha", 3): h1, h2, h3;
                                                                      # Hosts(...).start() without ``with``
        hosts.address("A")                       # 10.77.N.5: A's address on the bridge (also ``addr``)
        hosts.prefix("A")                        # ["ip", "netns", "exec", "msha-A"] (also ``prefix_argv``)
        hosts.call("A", ["ip", "-br", "addr"])   # run and wait; ``run`` starts a process (killed at close)
        with hosts.entered("A"):                 # this thread's new sockets and children live in A
            start_server(...)
        hosts.cut("A", "B"); hosts.heal("A", "B")
        hosts.isolate("A", except_=["B"])        # A reaches only B, and the test process (ROOT)
        hosts.cut("A", ROOT)                     # ... not even the test process
        hosts.heal_all()

How it works. Each host is a namespace ``<prefix>-<name>`` whose ``eth0`` is one end of a veth pair; the
other end is on the bridge ``<prefix>br`` in the test's own namespace (``ROOT``), which has the
subnet's address ``.1``, so the test process reaches every host and the hosts reach each other.
The subnet is ``10.77.N.0/24``, N from the prefix (another free one if that is taken here), unless
given.

A cut between two hosts drops their packets both ways: each of them has an nft table with a set of
blocked addresses, dropped on input by source and on output by destination. Packets are dropped, not
refused, so a connection across a cut hangs as across a real partition until its own timeouts end
it. ``tc netem`` is not available, so there is no delay or loss short of a cut.

Everything is named after the prefix. ``close`` (also on ``__exit__``, whatever failed) kills the
processes still inside the namespaces, by pid, and deletes the namespaces and the bridge; ``start``
first does the same for what an earlier run with the same prefix left behind.

A process in a namespace that listens on an *abstract* Unix socket (the instance servers' control
sockets) is reachable only from that namespace: ``entered`` moves the calling thread there (setns)
for the time of a block, so the test talks to it, and starts processes in it, without a wrapper.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import zlib
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import ServerError

ROOT = "root"  # the test's own namespace (the bridge's side): a host name for cut, heal and isolate
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
TABLE = "msfault"
SUBNET_FIRST, SUBNET_COUNT = 20, 200  # third octets of 10.77.N.0/24 a prefix may take
PREFIX_MAX_CHARS = 10  # interface names are at most 15 characters: <prefix>br, <prefix>v<i>
IP_TIMEOUT_S = 10.0  # one ip or nft command

_RULES = f"""table inet {TABLE} {{
  set blocked {{ type ipv4_addr; }}
  chain input {{ type filter hook input priority 0; policy accept; ip saddr @blocked drop; }}
  chain output {{ type filter hook output priority 0; policy accept; ip daddr @blocked drop; }}
}}
"""


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here (not root, no ``ip`` or ``nft``), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            return f"no `{tool}` command (Debian: apt-get install iproute2 nftables)"
    probe = f"msprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and out.returncode:
        raise ServerError(f"ip {' '.join(args)} failed: {out.stderr.strip()}")
    return out


class Hosts:
    """Namespaces named ``names`` (or ``h0..h{n-1}`` for a count) under ``prefix`` (see the module doc)."""

    def __init__(self, prefix: str, names: int | Iterable[str], subnet: str | None = None):
        if not prefix.isalnum() or len(prefix) > PREFIX_MAX_CHARS:
            raise ValueError(f"prefix: letters and digits, at most {PREFIX_MAX_CHARS}, got {prefix!r}")
        self.prefix_ = prefix
        self.names = [f"h{i + 1}" for i in range(names)] if isinstance(names, int) else list(names)
        if ROOT in self.names or len(set(self.names)) != len(self.names):
            raise ValueError(f"host names must be distinct and not {ROOT!r}: {self.names}")
        self.bridge = f"{prefix}br"
        self.cuts: set[frozenset[str]] = set()
        self.procs: list[subprocess.Popen] = []  # started by ``run``: killed at close
        self.subnet, self.net = subnet, ""

    def start(self) -> "Hosts":
        """Remove what an earlier run of the prefix left, then make the bridge and the namespaces."""
        if self.net:
            return self
        cleanup(self.prefix_)
        self.net = _subnet(self.subnet) if self.subnet else self._free_subnet()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    # -- addresses ---------------------------------------------------------------------------------
    def ns(self, host: str) -> str:
        """The namespace's name (``ip netns exec NS``)."""
        self._check(host)
        return f"{self.prefix_}-{host}"

    def address(self, host: str) -> str:
        """The host's IPv4 address (ROOT: the bridge's)."""
        if host == ROOT:
            return f"{self.net}.1"
        self._check(host)
        return f"{self.net}.{self.names.index(host) + 2}"

    def prefix(self, host: str) -> list[str]:
        """The argv prefix that runs a command in the host (for ``EtcdCluster(prefixes=...)``)."""
        return ["ip", "netns", "exec", self.ns(host)]

    addr = address
    prefix_argv = prefix

    def run(self, host: str, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` in the host (``subprocess.Popen``'s keywords); ``close`` kills it if it still runs."""
        kw.setdefault("start_new_session", True)
        proc = subprocess.Popen([*self.prefix(host), *argv], **kw)
        self.procs.append(proc)
        return proc

    def call(self, host: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` in the host and wait (``subprocess.run``'s keywords; output captured as text)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", IP_TIMEOUT_S)
        return subprocess.run([*self.prefix(host), *argv], **kw)

    @contextlib.contextmanager
    def entered(self, host: str) -> Iterator[None]:
        """The calling thread in the host's namespace for the block (sockets opened and processes started
        meanwhile stay there), then back in the one it was in."""
        if host == ROOT:
            yield
            return
        libc = ctypes.CDLL(None, use_errno=True)
        back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            there = os.open(NETNS_DIR / self.ns(host), os.O_RDONLY)
            try:
                if libc.setns(there, CLONE_NEWNET) != 0:
                    raise ServerError(f"setns into {self.ns(host)}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(there)
            try:
                yield
            finally:
                if libc.setns(back, CLONE_NEWNET) != 0:  # a thread left elsewhere would mislead every later call
                    raise ServerError(f"setns back: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(back)

    # -- faults ------------------------------------------------------------------------------------
    def cut(self, a: str, b: str) -> None:
        """Drop every packet between ``a`` and ``b``, both ways (either may be ROOT)."""
        self._blocked(a, b, "add")
        self.cuts.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        self._blocked(a, b, "delete")
        self.cuts.discard(frozenset((a, b)))

    def isolate(self, host: str, except_: Iterable[str] = ()) -> None:
        """Cut ``host`` from every other host but those named in ``except_``; the test process (ROOT)
        still reaches it (``cut(host, ROOT)`` for that)."""
        keep = set(except_)
        for other in self.names:
            if other != host and other not in keep and frozenset((host, other)) not in self.cuts:
                self.cut(host, other)

    def heal_all(self) -> None:
        for pair in list(self.cuts):
            a, b = sorted(pair)
            self.heal(a, b)

    def _blocked(self, a: str, b: str, op: str) -> None:
        if a == b:
            raise ValueError(f"cut: a host and itself ({a})")
        for here, there in ((a, b), (b, a)):
            if here == ROOT:
                continue  # the other side's rules drop both ways; ROOT's own firewall is not touched
            el = f"{{ {self.address(there)} }}"
            out = self.call(here, ["nft", op, "element", "inet", TABLE, "blocked", el])
            if out.returncode and not (op == "delete" and "No such file" in out.stderr):
                raise ServerError(f"nft {op} {there} in {here}: {out.stderr.strip()}")

    # -- lifecycle ---------------------------------------------------------------------------------
    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.net}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, host in enumerate(self.names):
            ns, outer, inner = self.ns(host), f"{self.prefix_}v{i}", f"{self.prefix_}p{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("-n", ns, "link", "set", inner, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            out = self.call(host, ["nft", "-f", "-"], input=_RULES)
            if out.returncode:
                raise ServerError(f"nft rules in {ns}: {out.stderr.strip()}")

    def _free_subnet(self) -> str:
        """``10.77.N``: N from the prefix, or the next one no interface here has an address in."""
        taken = _ip("-o", "-4", "addr", "show").stdout
        start = zlib.crc32(self.prefix_.encode()) % SUBNET_COUNT
        for k in range(SUBNET_COUNT):
            net = f"10.77.{SUBNET_FIRST + (start + k) % SUBNET_COUNT}"
            if f" {net}." not in taken:
                return net
        raise ServerError("no free 10.77.N.0/24 subnet for test hosts")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        cleanup(self.prefix_)
        self.cuts.clear()

    def __enter__(self) -> "Hosts":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, host: str) -> None:
        if host not in self.names:
            raise KeyError(f"no host {host!r} (hosts: {', '.join(self.names)})")


def _subnet(cidr: str) -> str:
    """``10.77.9.0/24`` or ``10.77.9`` as ``10.77.9`` (only /24 subnets)."""
    net = cidr.split("/")[0]
    parts = net.split(".")
    if len(parts) == 4 and parts[3] == "0":
        parts = parts[:3]
    if len(parts) != 3 or not all(p.isdigit() and int(p) < 256 for p in parts) or cidr.split("/")[1:] not in ([], ["24"]):
        raise ValueError(f"subnet: expected A.B.C.0/24, got {cidr!r}")
    return ".".join(parts)


def cleanup(prefix: str) -> list[str]:
    """Kill the processes inside ``prefix``'s namespaces (by pid), delete those namespaces and every link
    named after the prefix; what was removed. Harmless when there is nothing."""
    removed = []
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        ns = line.split(" ")[0].strip()
        if not ns.startswith(f"{prefix}-"):
            continue
        for pid in _ip("netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", ns, check=False)
        removed.append(ns)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        if name == f"{prefix}br" or _is_veth_of(name, prefix):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _is_veth_of(name: str, prefix: str) -> bool:
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    return len(rest) > 1 and rest[0] in "vp" and rest[1:].isdigit()
