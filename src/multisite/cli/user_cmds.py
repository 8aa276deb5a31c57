"""``multisite user add|remove|list``: who may use an instance server's client port, with which role."""

from __future__ import annotations

import secrets
import sys

import click

from ..errors import ConfigError
from ..instance.users import ROLES, add_user, list_users, remove_user
from .output import console, print_json, table


@click.group()
def user() -> None:
    """Users of the client port: a password or token (kept as an Argon2id hash), or a TLS client
    certificate whose common name is the user's name; a role each. With no users, clients need no
    authentication (the server then listens on loopback only, unless --insecure)."""


@user.command("add")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), required=True,
              help="read-only: get, items, info, history, regions; read-write: also commit, create_region; "
                   "admin: everything.")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of standard input.")
@click.option("--token", is_flag=True, help="Generate a random token as the secret and print it (once).")
@click.option("--cert-only", is_flag=True,
              help="No secret: the user authenticates only with a TLS client certificate whose common name is NAME.")
@click.option("--replace", is_flag=True, help="Replace an existing user's role and secret (a password change).")
def add_cmd(dir: str, name: str, role: str, password_stdin: bool, token: bool, cert_only: bool,
            replace: bool) -> None:
    """Add a user; the server takes it on the next connection (no restart). Without --password-stdin,
    --token or --cert-only the password is asked for at a prompt.

    Example: echo 's3cret-pass' | multisite user add /data/A alice --role read-write --password-stdin
    """
    secret = read_secret(name, password_stdin, token, cert_only)
    u = add_user(dir, name, role, secret, replace=replace)
    tell_added(u, secret if token else None, replace)


def read_secret(name: str, password_stdin: bool, token: bool, cert_only: bool) -> str | None:
    """The secret ``user add`` (and ``grid user add``) was given: None for a certificate-only user."""
    if password_stdin + token + cert_only > 1:
        raise ConfigError("give at most one of --password-stdin, --token and --cert-only")
    if cert_only:
        return None
    if token:
        return secrets.token_urlsafe(32)
    if password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    return click.prompt(f"password for {name}", hide_input=True, confirmation_prompt=True)


def tell_added(u, token: str | None, replace: bool) -> None:
    """What ``user add`` prints: a generated token alone on stdout (once), or one line."""
    if token:
        click.echo(token)  # alone on stdout, for scripts; the note goes to stderr
        click.echo(f"user {u.name} added (role {u.role}); the token above is not stored and is shown only once",
                   err=True)
    else:
        console.print(f"user {u.name} {'set' if replace else 'added'} (role {u.role}, by {u.by})")


@user.command("remove")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.argument("name")
def remove_cmd(dir: str, name: str) -> None:
    """Remove a user: new connections as this user are refused, open ones at their next request.

    Example: multisite user remove /data/A alice
    """
    u = remove_user(dir, name)
    console.print(f"user {u.name} removed (was {u.role})")


@user.command("list")
@click.argument("dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {name, role, by}.")
def list_cmd(dir: str, as_json: bool) -> None:
    """The users of an instance, their roles and how they authenticate (never their secrets).

    Example: multisite user list /data/A --json
    """
    rows = [{"name": u.name, "role": u.role, "by": u.by} for u in list_users(dir)]
    if as_json:
        print_json(rows)
        return
    table("users", ["name", "role", "by"], [(r["name"], r["role"], r["by"]) for r in rows], whole=["name"])


def register(cli: click.Group) -> None:
    cli.add_command(user)
