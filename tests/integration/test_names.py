"""Names are checked at the handshake: a Source Server started for one secondary that reaches another
instance's receiver is refused on both sides, sends nothing and files no slot; the right name streams.

Real processes through the CLI, as an operator runs them (helpers from test_replication_cli).
"""

from __future__ import annotations

import re

from multisite.testing.checks import assert_same_data, wait_until

from .test_replication_cli import instances, ms, ms_json, write  # noqa: F401 - instances is a fixture


def test_a_source_for_another_name_is_refused_on_both_sides(instances):  # noqa: F811 - the fixture
    a, b = instances["A"], instances["B"]
    a_port = int(re.search(r"clients on port (\d+)", ms("server", "start", a, "--listen", "127.0.0.1:0").stdout)[1])
    ms("server", "start", b)
    out = ms("receiver", "start", b, "--listen", "127.0.0.1:0").stdout
    port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", out)[1])
    last = write(a_port, 20)

    # A thinks it feeds C, but the address is B's receiver.
    ms("source", "start", a, "--secondary", "C", "--connect", f"127.0.0.1:{port}", "--heartbeat-interval", "0.2")
    st = wait_until(lambda: (s := ms_json("source", "status", a, "--secondary", "C"))["last_error"] and s,
                    what="the source refuses B")
    err = st["last_error"]
    assert err.startswith("WRONG_NAME:") and "'C'" in err and "'B'" in err, err
    assert "--secondary B" in err and f"127.0.0.1:{port}" in err, err
    assert st["state"] in ("connecting", "handshake") and st["last_sent"] == st["last_confirmed"] == 0
    assert st["sent_records"] == 0
    rs = wait_until(lambda: (r := ms_json("receiver", "status", b))["last_error"] and r,
                    what="the receiver logs the refusal")
    assert rs["last_error"].startswith("WRONG_NAME:") and rs["seqno"] == rs["received_seqno"] == 0, rs
    # B refuses first (the source's Hello names C), before anything could change on B; A logs it too.
    assert "refused: WRONG_NAME" in (a / "log" / "source-C.log").read_text()
    assert "refusing source A: WRONG_NAME" in (b / "log" / "receiver.log").read_text()

    ms("source", "stop", a, "--secondary", "C")
    slots = ms_json("instance", "show", a)["slots"]
    assert slots == {}, slots  # neither B's position under C, nor a slot for C pinning the journal

    # The right name streams.
    ms("source", "start", a, "--secondary", "B", "--connect", f"127.0.0.1:{port}", "--heartbeat-interval", "0.2")
    st = wait_until(lambda: (s := ms_json("source", "status", a, "--secondary", "B"))["last_confirmed"] == last
                    and s, what="B confirms")
    assert st["state"] == "streaming" and st["last_error"] is None
    ms("server", "stop", a)
    ms("server", "stop", b)
    assert set(ms_json("instance", "show", a)["slots"]) == {"B"}
    assert_same_data(a, b)
