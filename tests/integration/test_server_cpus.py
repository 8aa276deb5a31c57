"""``multisite server start --cpus``: the server process and every thread it starts run on those CPUs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import multisite
from multisite.cli.main import cli
from multisite.server.process import start_server, stop_server
from multisite.errors import ConfigError
from multisite.net.affinity import parse_cpus


def test_parse_cpus_accepts_lists_and_ranges_and_names_what_is_wrong():
    allowed = sorted(os.sched_getaffinity(0))
    lo, hi = allowed[0], allowed[-1]
    assert parse_cpus(str(lo)) == {lo}
    if allowed == list(range(lo, hi + 1)):  # a contiguous set, as on every machine here
        assert parse_cpus(f"{lo}-{hi}") == set(allowed) == parse_cpus(",".join(map(str, allowed)))
    with pytest.raises(ConfigError, match="CPU numbers and ranges"):
        parse_cpus("first")
    with pytest.raises(ConfigError, match=f"may run on {lo}"):
        parse_cpus("4096")


def _task_cpus(pid: int) -> set[str]:
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out.add(line.split(":", 1)[1].strip())
    return out


def test_the_server_and_its_threads_run_on_the_cpus_asked(tmp_path):
    cpu = sorted(os.sched_getaffinity(0))[0]
    root = multisite.create(tmp_path / "A", name="A", durability="group")
    info = start_server(root, "127.0.0.1:0", str(cpu))
    try:
        c = multisite.connect(f"127.0.0.1:{info['client_port']}")
        c.create_region("acct")
        assert c.set("acct", ("a",), 1) == 1  # executor threads exist now
        assert info["cpus"] == [cpu]
        assert _task_cpus(info["pid"]) == {str(cpu)}
        res = CliRunner().invoke(cli, ["status", str(root), "--json"])
        assert res.exit_code == 0 and '"cpus": [' in res.output and '"durability": "group"' in res.output
        res = CliRunner().invoke(cli, ["status", str(root)])
        assert res.exit_code == 0 and "CPUs" in res.output and "group" in res.output
    finally:
        stop_server(root)


def test_a_cpu_the_machine_lacks_is_refused_before_anything_starts(tmp_path):
    root = multisite.create(tmp_path / "A", name="A")
    res = CliRunner().invoke(cli, ["server", "start", str(root), "--cpus", "4096"])
    assert res.exit_code != 0 and "not available" in res.output
    assert not (root / "run" / "server.json").exists()


def test_cpu_lists_print_as_ranges():
    from multisite.cli.server_cmds import _cpu_list

    assert _cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and _cpu_list([3]) == "3"
