"""instance.users: the users file (Argon2id hashes, crash-safe replace, reload on change) and the
``multisite user`` commands over it. Real instance directories, real hashes."""

from __future__ import annotations

import json
import os
import stat

import pytest
from click.testing import CliRunner

from multisite.cli.main import cli
from multisite.errors import ConfigError, InstanceFileCorrupt, NotAnInstance
from multisite.instance import users as U


def test_a_secret_is_stored_only_as_an_argon2id_hash_and_verifies(inst):
    U.add_user(inst, "alice", "read-write", "correct horse")
    raw = (inst / "users.json").read_text()
    assert "correct horse" not in raw
    secret = json.loads(raw)["users"]["alice"]["secret"]
    assert secret.startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    table = U.load_users(inst)
    assert table.verify("alice", "correct horse").role == "read-write"
    assert table.verify("alice", "correct horsE") is None
    assert table.verify("nobody", "correct horse") is None
    assert table.verify("alice", "x" * (U.MAX_SECRET_CHARS + 1)) is None
    assert stat.S_IMODE(os.stat(inst / "users.json").st_mode) == 0o600


def test_two_hashes_of_one_secret_differ_by_their_salt():
    assert U.hash_secret("same-secret") != U.hash_secret("same-secret")


def test_a_certificate_only_user_never_verifies_by_password(inst):
    U.add_user(inst, "svc", "read-only", None)
    table = U.load_users(inst)
    assert table.get("svc").by == "certificate"
    assert table.verify("svc", "") is None and table.verify("svc", "anything-at-all") is None


def test_add_refuses_duplicates_bad_names_roles_and_short_secrets(inst):
    U.add_user(inst, "alice", "admin", "long-enough")
    with pytest.raises(ConfigError, match="already exists.*--replace"):
        U.add_user(inst, "alice", "admin", "long-enough")
    with pytest.raises(ConfigError, match="--role takes one of read-only, read-write, admin"):
        U.add_user(inst, "bob", "root", "long-enough")
    with pytest.raises(ConfigError, match="8 to 1024 characters"):
        U.add_user(inst, "bob", "admin", "short")
    for bad in ("", " bob", "bob\n", "x" * 200):
        with pytest.raises(ConfigError, match="user name"):
            U.add_user(inst, bad, "admin", "long-enough")
    assert [u.name for u in U.list_users(inst)] == ["alice"]


def test_remove_and_list(inst):
    U.add_user(inst, "b", "read-only", "long-enough")
    U.add_user(inst, "a", "admin", None)
    assert [(u.name, u.role, u.by) for u in U.list_users(inst)] == [("a", "admin", "certificate"),
                                                                    ("b", "read-only", "password")]
    assert U.remove_user(inst, "b").role == "read-only"
    with pytest.raises(ConfigError, match="no user 'b'"):
        U.remove_user(inst, "b")
    assert [u.name for u in U.list_users(inst)] == ["a"]


def test_not_an_instance_is_refused(tmp_path):
    with pytest.raises(NotAnInstance):
        U.add_user(tmp_path, "a", "admin", "long-enough")


def test_a_damaged_users_file_is_named_and_not_half_read(inst):
    (inst / "users.json").write_text('{"format": 1, "users": {"a": {"role": "god", "secret": null}}}')
    with pytest.raises(InstanceFileCorrupt, match="users.json.*--role takes one of"):
        U.load_users(inst)
    (inst / "users.json").write_text('{"format": 1, "users": {"a": {"role": "admin", "secret": "plaintext"}}}')
    with pytest.raises(InstanceFileCorrupt, match="not an Argon2id hash"):
        U.load_users(inst)
    (inst / "users.json").write_text("{not json")
    with pytest.raises(InstanceFileCorrupt, match="cannot be read"):
        U.load_users(inst)


def test_the_users_file_is_reread_when_it_changes_and_a_bad_change_keeps_the_last_good(inst):
    f = U.UserFile(inst)
    assert len(f.current()) == 0
    U.add_user(inst, "a", "admin", "long-enough")
    assert [u.name for u in f.current()] == ["a"]
    good = f.current()
    assert f.current() is good  # unchanged file: not read again
    (inst / "users.json").write_text("{broken")
    with pytest.raises(InstanceFileCorrupt):
        f.current()
    assert f.current() is good  # raised once for that change; the last good table stays
    (inst / "users.json").unlink()
    assert len(f.current()) == 0


def test_user_commands(inst):
    r = CliRunner()
    res = r.invoke(cli, ["user", "add", str(inst), "alice", "--role", "read-only", "--password-stdin"],
                   input="s3cret-pass\n")
    assert res.exit_code == 0, res.output
    assert U.load_users(inst).verify("alice", "s3cret-pass").role == "read-only"
    res = r.invoke(cli, ["user", "add", str(inst), "app", "--role", "read-write", "--token"])
    assert res.exit_code == 0, res.output
    token = res.stdout.splitlines()[0]
    assert len(token) >= 40 and U.load_users(inst).verify("app", token).name == "app"
    res = r.invoke(cli, ["user", "add", str(inst), "bob", "--role", "admin"], input="pw-of-bob\npw-of-bob\n")
    assert res.exit_code == 0, res.output
    assert U.load_users(inst).verify("bob", "pw-of-bob").role == "admin"
    res = r.invoke(cli, ["user", "add", str(inst), "svc", "--role", "admin", "--cert-only"])
    assert res.exit_code == 0 and "by certificate" in res.output
    res = r.invoke(cli, ["user", "list", str(inst), "--json"])
    assert json.loads(res.stdout) == [{"name": "alice", "role": "read-only", "by": "password"},
                                      {"name": "app", "role": "read-write", "by": "password"},
                                      {"name": "bob", "role": "admin", "by": "password"},
                                      {"name": "svc", "role": "admin", "by": "certificate"}]
    res = r.invoke(cli, ["user", "list", str(inst)])
    assert "alice" in res.output and "$argon2" not in res.output
    res = r.invoke(cli, ["user", "remove", str(inst), "bob"])
    assert res.exit_code == 0 and "bob removed" in res.output
    res = r.invoke(cli, ["user", "add", str(inst), "x", "--role", "admin", "--token", "--cert-only"])
    assert res.exit_code == 1 and "CONFIG: give at most one of" in res.output
    res = r.invoke(cli, ["user", "add", str(inst), "x", "--role", "admin", "--password-stdin"], input="short\n")
    assert res.exit_code == 1 and "8 to 1024 characters" in res.output



def test_a_backup_keeps_the_users(inst, tmp_path):
    from multisite.instance.maintenance import backup

    U.add_user(inst, "alice", "read-write", "correct horse")
    backup(inst, tmp_path / "copy")
    assert U.load_users(tmp_path / "copy").verify("alice", "correct horse").role == "read-write"
    assert stat.S_IMODE(os.stat(tmp_path / "copy" / "users.json").st_mode) == 0o600


def test_replace_changes_a_users_role_and_secret_in_one_step(inst):
    U.add_user(inst, "alice", "admin", "old-password")
    U.add_user(inst, "alice", "read-only", "new-password", replace=True)
    table = U.load_users(inst)
    assert table.verify("alice", "old-password") is None
    assert table.verify("alice", "new-password").role == "read-only"
    res = CliRunner().invoke(cli, ["user", "add", str(inst), "alice", "--role", "read-write", "--password-stdin",
                                   "--replace"], input="third-password\n")
    assert res.exit_code == 0 and "user alice set (role read-write" in res.output
    assert U.load_users(inst).verify("alice", "third-password").role == "read-write"
