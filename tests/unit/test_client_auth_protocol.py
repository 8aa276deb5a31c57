"""protocol.auth: a connection's authentication state machine, the rights table, pacing of failed
attempts (a fake clock: no sleeps) and the listen-address rule. The user table is the real one
(instance.users, real Argon2id hashes)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multisite.errors import (AuthenticationFailed, AuthenticationPaced, AuthenticationRequired, ConfigError,
                              PermissionDenied)
from multisite.instance.users import ROLES, User, UserTable, hash_secret
from multisite.protocol import auth
from multisite.protocol.auth import (AUTHENTICATED, AWAIT_HELLO, REFUSED, ConnectionAuth, Pacer, PacingPolicy,
                                     allows, check_listen, is_loopback, required_role)
from multisite.protocol.client import OPS


@pytest.fixture(scope="module")
def users() -> UserTable:
    return UserTable({
        "reader": User("reader", "read-only", hash_secret("reader-pass")),
        "writer": User("writer", "read-write", hash_secret("writer-pass")),
        "boss": User("boss", "admin", hash_secret("boss-pass")),
        "svc": User("svc", "read-write", None),  # by certificate only
    })


def conn(users, pacer=None, *, required=True, cert_name=None, address="10.0.0.7") -> ConnectionAuth:
    return ConnectionAuth(users, pacer if pacer is not None else Pacer(), address, required=required, cert_name=cert_name)


# -- the rights table ----------------------------------------------------------------------------
def test_roles_are_the_user_stores_roles_lowest_first():
    assert tuple(auth.ROLE_RANK) == ROLES
    assert sorted(auth.ROLE_RANK.values()) == list(auth.ROLE_RANK.values())


def test_every_client_op_has_a_right_and_reads_writes_admin_are_split():
    assert set(OPS) <= set(auth.RIGHTS)
    for op in ("get", "items", "info", "history", "regions"):
        assert required_role(op) == "read-only"
        assert all(allows(r, op) for r in ROLES)
    for op in ("commit", "create_region"):
        assert required_role(op) == "read-write"
        assert not allows("read-only", op) and allows("read-write", op) and allows("admin", op)
    for op in ("stop", "rollback", "an-op-added-later"):
        assert required_role(op) == "admin"
        assert not allows("read-write", op) and allows("admin", op)
    assert not allows("no-such-role", "get")


# -- the state machine ---------------------------------------------------------------------------
def test_a_server_without_required_auth_admits_everything_as_before(users):
    c = conn(users, required=False)
    assert c.state == AUTHENTICATED and c.role == "admin"
    assert c.admit("commit", {}, 0.0) is None and c.admit("stop", {}, 0.0) is None
    assert c.admit("hello", {"user": "x", "password": "whatever"}, 0.0) == {"user": None, "role": "admin",
                                                                          "by": "open"}


def test_requests_before_hello_are_refused_except_history(users):
    c = conn(users)
    assert c.state == AWAIT_HELLO
    with pytest.raises(AuthenticationRequired, match="requires authentication.*'get'"):
        c.admit("get", {}, 0.0)
    assert c.admit("history", {}, 0.0) is None  # rollback --fetchresync reads it
    assert c.state == AWAIT_HELLO and not c.must_close


def test_hello_with_the_right_password_authenticates_with_the_users_role(users):
    c = conn(users)
    assert c.admit("hello", {"user": "writer", "password": "writer-pass"}, 0.0) == {
        "user": "writer", "role": "read-write", "by": "password"}
    assert c.state == AUTHENTICATED
    assert c.admit("commit", {}, 0.0) is None
    assert c.take_events() == ["client 10.0.0.7 authenticated as 'writer' (role read-write) by password"]


def test_a_wrong_password_refuses_and_the_connection_stays_refused(users):
    c = conn(users)
    with pytest.raises(AuthenticationFailed, match="wrong user or password") as ei:
        c.admit("hello", {"user": "writer", "password": "nope-nope"}, 0.0)
    assert type(ei.value) is AuthenticationFailed
    assert c.state == REFUSED and c.must_close
    [line] = c.take_events()
    assert line.startswith("client 10.0.0.7 refused: wrong password for 'writer' (1 failures")
    with pytest.raises(AuthenticationFailed):  # sticky: even the right password now
        c.admit("hello", {"user": "writer", "password": "writer-pass"}, 0.0)
    with pytest.raises(AuthenticationFailed):
        c.admit("get", {}, 0.0)


def test_an_unknown_user_gets_the_same_answer_as_a_wrong_password(users):
    a, b = conn(users), conn(users)
    with pytest.raises(AuthenticationFailed) as unknown:
        a.admit("hello", {"user": "mallory", "password": "writer-pass"}, 0.0)
    with pytest.raises(AuthenticationFailed) as wrong:
        b.admit("hello", {"user": "writer", "password": "mallory-pass"}, 0.0)
    assert unknown.value.message.replace("mallory", "X") == wrong.value.message.replace("writer", "X")
    assert "unknown user for 'mallory'" in a.take_events()[0]  # the log tells the operator which


def test_a_read_only_user_may_read_but_not_write(users):
    c = conn(users)
    c.admit("hello", {"user": "reader", "password": "reader-pass"}, 0.0)
    c.take_events()
    for op in ("get", "items", "info", "history", "regions"):
        assert c.admit(op, {}, 0.0) is None
    with pytest.raises(PermissionDenied, match="'reader' has the read-only role; 'commit' needs read-write"):
        c.admit("commit", {}, 0.0)
    assert c.state == AUTHENTICATED and not c.must_close  # denied, not refused: it may go on reading
    assert c.take_events() == ["client 10.0.0.7 as 'reader' (role read-only) denied 'commit'"]


def test_only_admin_may_stop_or_roll_back(users):
    w, a = conn(users), conn(users)
    w.admit("hello", {"user": "writer", "password": "writer-pass"}, 0.0)
    a.admit("hello", {"user": "boss", "password": "boss-pass"}, 0.0)
    for op in ("stop", "rollback"):
        with pytest.raises(PermissionDenied, match="needs admin"):
            w.admit(op, {}, 0.0)
        assert a.admit(op, {}, 0.0) is None


def test_a_certificate_naming_a_user_authenticates_from_the_start(users):
    c = conn(users, cert_name="svc")
    assert (c.state, c.user, c.role, c.by) == (AUTHENTICATED, "svc", "read-write", "certificate")
    assert c.admit("commit", {}, 0.0) is None
    assert c.admit("hello", {}, 0.0) == {"user": "svc", "role": "read-write", "by": "certificate"}
    assert c.admit("hello", {"user": "svc"}, 0.0)["user"] == "svc"


def test_a_certificate_naming_no_user_must_still_say_hello_with_a_password(users):
    c = conn(users, cert_name="client")
    assert c.state == AWAIT_HELLO
    with pytest.raises(AuthenticationFailed, match="common name 'client' is not a user"):
        conn(users, cert_name="client").admit("hello", {}, 0.0)
    assert c.admit("hello", {"user": "reader", "password": "reader-pass"}, 0.0)["role"] == "read-only"


def test_a_certificate_only_user_without_a_certificate_is_refused(users):
    c = conn(users)
    with pytest.raises(AuthenticationFailed, match="no client certificate on this connection"):
        c.admit("hello", {"user": "svc"}, 0.0)
    assert c.must_close
    d = conn(users)  # nor can a password stand in for its certificate
    with pytest.raises(AuthenticationFailed, match="wrong user or password"):
        d.admit("hello", {"user": "svc", "password": "anything-at-all"}, 0.0)
    assert "user with a certificate only" in d.take_events()[0]
    e = conn(users, cert_name="writer")
    with pytest.raises(AuthenticationFailed, match="names 'writer', not 'svc'"):
        e.admit("hello", {"user": "svc"}, 0.0)


def test_malformed_hellos_are_config_errors_and_do_not_refuse(users):
    c = conn(users)
    for args in ([], {"user": 5, "password": "x"}, {"user": "", "password": "x"}, {"password": "no-user"},
                 {"user": "reader", "password": 5}, {"user": "reader", "password": "x" * 5000}):
        with pytest.raises(ConfigError, match="hello"):
            c.admit("hello", args, 0.0)
    assert c.state == AWAIT_HELLO


# -- pacing of failed attempts (a fake clock) -----------------------------------------------------
def test_pacing_policy_grows_the_delay_and_caps_it():
    p = PacingPolicy(free_failures=3, first_delay_s=1.0, max_delay_s=300.0)
    assert [p.delay_s(n) for n in range(0, 8)] == [0, 0, 0, 0, 1, 2, 4, 8]
    assert p.delay_s(50) == 300.0 and p.delay_s(10_000) == 300.0


def test_pacer_counts_per_address_and_forgets_after_quiet():
    pacer = Pacer(PacingPolicy(free_failures=1, first_delay_s=2.0, forget_after_s=100.0))
    assert pacer.failed("a", 0.0) == 0.0
    assert pacer.wait_s("a", 0.0) == 0.0
    assert pacer.failed("a", 1.0) == 2.0
    assert pacer.wait_s("a", 1.0) == 2.0 and pacer.wait_s("a", 2.5) == 0.5 and pacer.wait_s("a", 3.0) == 0.0
    assert pacer.wait_s("b", 1.0) == 0.0  # another address is not slowed
    assert pacer.failures("a", 100.9) == 2
    assert pacer.failures("a", 101.0) == 0 and len(pacer) == 0  # forgotten


def test_pacer_remembers_a_bounded_number_of_addresses_oldest_first():
    pacer = Pacer(PacingPolicy(max_addresses=3))
    for i, a in enumerate("abcd"):
        pacer.failed(a, float(i))
    assert len(pacer) == 3 and pacer.failures("a", 4.0) == 0 and pacer.failures("d", 4.0) == 1
    pacer.failed("b", 5.0)  # b moves to the end: c is now the oldest
    pacer.failed("e", 6.0)
    assert pacer.failures("c", 6.0) == 0 and pacer.failures("b", 6.0) == 2


def test_brute_force_is_paced_and_attempts_inside_the_wait_are_not_even_checked(users):
    pacer = Pacer(PacingPolicy(free_failures=2, first_delay_s=1.0, max_delay_s=8.0))
    now = 0.0

    def attempt(password: str, at: float, address: str = "10.0.0.7"):
        c = conn(users, pacer, address=address)
        try:
            return c.admit("hello", {"user": "boss", "password": password}, at)
        finally:
            c.take_events()

    for _ in range(2):  # the free failures, answered at once
        with pytest.raises(AuthenticationFailed):
            attempt("guess-guess", now)
    with pytest.raises(AuthenticationFailed) as ei:
        attempt("guess-guess", now)  # the third: now a 1 s wait
    assert type(ei.value) is AuthenticationFailed
    with pytest.raises(AuthenticationPaced, match="try again in 0.5 s"):
        attempt("boss-pass", now + 0.5)  # even the right password: refused unseen inside the wait
    assert pacer.failures("10.0.0.7", now) == 3  # a paced attempt is not counted
    assert attempt("boss-pass", now + 0.5, address="10.0.0.8")["role"] == "admin"  # another address: not paced
    now += 1.0
    with pytest.raises(AuthenticationFailed):
        attempt("guess-guess", now)  # fourth failure: 2 s
    with pytest.raises(AuthenticationPaced, match="try again in 2.0 s"):
        attempt("guess-guess", now)
    for _ in range(5):
        now += pacer.wait_s("10.0.0.7", now)
        with pytest.raises(AuthenticationFailed):
            attempt("guess-guess", now)
    assert pacer.wait_s("10.0.0.7", now) == 8.0  # capped
    now += 8.0
    assert attempt("boss-pass", now)["role"] == "admin"  # after the wait the right password works


def test_a_paced_attempt_refuses_the_connection_and_logs_it(users):
    pacer = Pacer(PacingPolicy(free_failures=0, first_delay_s=5.0))
    pacer.failed("10.0.0.7", 0.0)
    c = conn(users, pacer)
    with pytest.raises(AuthenticationPaced):
        c.admit("hello", {"user": "boss", "password": "boss-pass"}, 1.0)
    assert c.must_close
    assert c.take_events() == ["client 10.0.0.7 refused: authentication as 'boss' paced (1 failures from this "
                               "address, 4.0 s to wait)"]


def test_certificate_hellos_are_not_paced(users):
    pacer = Pacer(PacingPolicy(free_failures=0, first_delay_s=60.0))
    pacer.failed("10.0.0.7", 0.0)
    assert conn(users, pacer, cert_name="svc").admit("hello", {}, 1.0)["user"] == "svc"


# -- the listen address ---------------------------------------------------------------------------
@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
                                       ("localhost", True), ("0.0.0.0", False), ("", False), ("::", False),
                                       ("10.1.2.3", False), ("db.example.org", False)])
def test_is_loopback(host, loop):
    assert is_loopback(host) is loop


def test_a_non_loopback_listen_without_users_is_refused_unless_insecure():
    with pytest.raises(ConfigError, match="--listen 0.0.0.0 .*--insecure"):
        check_listen("0.0.0.0", 0, False)
    check_listen("0.0.0.0", 0, True)
    check_listen("0.0.0.0", 1, False)
    check_listen("127.0.0.1", 0, False)


def test_the_state_table_in_the_protocol_doc_is_the_codes():
    from pathlib import Path

    import multisite

    doc = (Path(multisite.__file__).parents[2] / "docs" / "protocol.md").read_text()
    section = doc.split("## 11. Client authentication", 1)[1]
    rows = [line.strip("|").split("|") for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| state") and line.count("|") == 4]
    documented = {(s.strip(), n.split("(")[0].strip()) for s, _e, n in rows if s.strip() in auth._TRANSITIONS}
    code = {(s, n) for s, nexts in auth._TRANSITIONS.items() for n in nexts}
    assert (REFUSED, REFUSED) in documented  # "refused | anything | refused": it stays, no transition
    assert documented - {(REFUSED, REFUSED)} == code


@given(free=st.integers(0, 4), first=st.floats(0.1, 5.0), cap=st.floats(1.0, 60.0),
       gaps=st.lists(st.floats(0.0, 30.0), min_size=1, max_size=60))
def test_a_guesser_gets_each_guess_only_after_the_growing_wait_whatever_its_timing(free, first, cap, gaps):
    """Model: a guesser tries at arbitrary times; the attempts the pacer lets through (to be hashed and
    failed) are spaced by at least the delay its failures so far earned, and no wait exceeds the cap."""
    policy = PacingPolicy(free_failures=free, first_delay_s=first, max_delay_s=cap, forget_after_s=10**9)
    pacer = Pacer(policy)
    now, checked = 0.0, []
    for gap in gaps:
        now += gap
        wait = pacer.wait_s("g", now)
        assert 0.0 <= wait <= cap
        if wait == 0.0:
            checked.append(now)
            pacer.failed("g", now)
    assert pacer.failures("g", now) == len(checked)
    for i in range(1, len(checked)):
        assert checked[i] - checked[i - 1] >= policy.delay_s(i) - 1e-9


@pytest.mark.parametrize("host,key", [("10.0.0.7", "10.0.0.7"), ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
                                      ("2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"), ("::ffff:10.0.0.7", "10.0.0.7"),
                                      ("[::1]", "::/64"), ("some-name", "some-name")])
def test_pacing_key_is_the_ipv4_address_or_the_ipv6_64(host, key):
    assert auth.pacing_key(host) == key


def test_an_ipv6_guesser_changing_address_within_its_64_stays_paced(users):
    pacer = Pacer(PacingPolicy(free_failures=1, first_delay_s=10.0))
    for i in range(2):
        with pytest.raises(AuthenticationFailed):
            conn(users, pacer, address=f"2001:db8::{i + 1}").admit("hello", {"user": "boss", "password": "x" * 8}, 0.0)
    with pytest.raises(AuthenticationPaced):
        conn(users, pacer, address="2001:db8::99").admit("hello", {"user": "boss", "password": "boss-pass"}, 1.0)


def test_refresh_ends_a_removed_users_session_and_a_replaced_passwords_and_applies_a_new_role(users):
    by_pw, by_cert, other = conn(users), conn(users, cert_name="svc"), conn(users)
    by_pw.admit("hello", {"user": "writer", "password": "writer-pass"}, 0.0)
    other.admit("hello", {"user": "reader", "password": "reader-pass"}, 0.0)
    changed = UserTable({
        "reader": users.get("reader"),  # unchanged
        "writer": User("writer", "read-write", hash_secret("writer-pass")),  # the same password, hashed anew
        "svc": User("svc", "admin", None),  # a new role
    })
    for c in (by_pw, by_cert, other):
        c.take_events()
        c.refresh(changed)
    assert by_pw.must_close
    with pytest.raises(AuthenticationFailed, match="'writer' has a new password or token: authenticate again"):
        by_pw.admit("get", {}, 0.0)
    assert by_pw.take_events() == ["client 10.0.0.7 refused: user 'writer' has a new password or token, session ended"]
    assert by_cert.role == "admin" and by_cert.admit("stop", {}, 0.0) is None
    assert by_cert.take_events() == ["client 10.0.0.7 as 'svc': role now admin (was read-write)"]
    assert other.admit("get", {}, 0.0) is None and other.take_events() == []
    other.refresh(UserTable({}))
    with pytest.raises(AuthenticationFailed, match="'reader' was removed"):
        other.admit("get", {}, 0.0)
