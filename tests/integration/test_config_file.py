"""``server start --config FILE.toml`` with real server processes: the server's options and the
components the file names (receiver, Source Servers) come from the file, and they come back when the
server is restarted without ``--config``; a component started by hand does not."""

from __future__ import annotations


from click.testing import CliRunner

from multisite import engine
from multisite.cli.main import cli
from multisite.net import control
from multisite.server.process import stop_server
from multisite.testing.checks import wait_until
from multisite.testing.ports import free_port


def run(*args: str) -> str:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def test_server_and_components_from_a_file_survive_a_restart(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    engine.create(a, "A", durability="group")
    engine.create(b, "B", durability="group")
    port = free_port()
    (tmp_path / "b.toml").write_text(f'[server]\nlisten = "127.0.0.1:0"\n\n[receiver]\nlisten = "127.0.0.1:{port}"\n'
                                     f'stats-interval = 2.5\n')
    (tmp_path / "a.toml").write_text(f'[server]\ndir = "{a}"\nlisten = "127.0.0.1:0"\nkeepalive = 45\n'
                                     f'metrics = "127.0.0.1:0"\n\n[source.B]\nconnect = "127.0.0.1:{port}"\n'
                                     f'compress = 3\nheartbeat-interval = 0.3\nheartbeat-timeout = 3\n')
    try:
        out = run("server", "start", str(b), "--config", str(tmp_path / "b.toml"))
        assert "receiver start" in out
        out = run("server", "start", "--config", str(tmp_path / "a.toml"))  # dir from the file
        assert "source start --secondary B" in out and "metrics on port" in out
        st = control.call(a, "status")
        assert st["metrics"] and st["sources"]["B"]["compress_level"] == 3
        assert control.call(b, "status")["receiver"]["listen"] == f"127.0.0.1:{port}"
        import multisite
        with multisite.connect(f"127.0.0.1:{st['client_port']}") as db:
            db.create_region("r")
            db.set("r", ("k",), 1)
        wait_until(lambda: control.call(b, "status")["seqno"] == 1, timeout_s=20, what="B caught up")
        # By hand, not from the file: a passive source to C.
        run("source", "start", str(a), "--secondary", "C", "--connect", "127.0.0.1:1", "--passive")
        assert set(control.call(a, "status")["sources"]) == {"B", "C"}

        stop_server(a)
        out = run("server", "start", str(a))  # no --config: the recorded file
        assert "source start --secondary B" in out
        st = control.call(a, "status")
        assert set(st["sources"]) == {"B"} and st["sources"]["B"]["compress_level"] == 3 and st["metrics"]
        with multisite.connect(f"127.0.0.1:{st['client_port']}") as db:
            db.set("r", ("k",), 2)
        wait_until(lambda: control.call(b, "status")["seqno"] == 2, timeout_s=20, what="B caught up again")
    finally:
        for d in (a, b):
            if control.is_running(d):
                stop_server(d)
