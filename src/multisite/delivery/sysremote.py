"""Publications, remote users and the SYSREMOTEUSER table, kept in the instance itself.

Everything delivery keeps lives in three system regions of the instance, so it is journaled and
recovered like any data, and a state change commits atomically with what it describes:

- ``syspublication``: one row per publication: ``(name,)`` -> regions and subscribe-by field.
- ``sysremoteuser``: per remote user (a subscriber on the consolidated instance, the consolidated
  instance on a remote): ``(user, "def")`` its definition (publication, address, value, role, key),
  ``(user, "out")`` the sending half of the seed's row (``log_sent``, ``confirm_sent``, ...) and
  ``(user, "in")`` the receiving half (``log_received``, ``confirm_received``, ...). The received
  transactions of a message commit in one transaction with their ``(user, "in")`` row: that is what
  makes applying exactly once across crashes, and it also marks the transaction as coming from
  ``user``, so that it is not sent back to it (it is forwarded to the other subscribers).
- ``sysconflict``: the update conflicts resolved, for applications to read.
- ``(".", "self")`` in ``sysremoteuser``: this instance's own inbox address and role.

System regions are never published (``publish`` refuses them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import DeliveryConfigError
from ..journal.records import SET
from ..values import encode_value
from .machine import ReceiveState, SendState

PUBLICATION_REGION = "syspublication"
STATE_REGION = "sysremoteuser"
CONFLICT_REGION = "sysconflict"
SYSTEM_REGIONS = frozenset({PUBLICATION_REGION, STATE_REGION, CONFLICT_REGION})
SELF_KEY = (".", "self")
ROLE_CONSOLIDATED, ROLE_REMOTE = "consolidated", "remote"


@dataclass
class Publication:
    name: str
    regions: list[str]
    subscribe_by: str | None = None


@dataclass
class Link:
    """A remote user of this instance: who, through which publication, at which address."""

    user: str
    publication: str
    address: str
    value: str | None = None  # the subscribe-by value (None: every row of the publication)
    peer_role: str = ROLE_REMOTE  # what the other side is: a remote (we are consolidated) or the consolidated
    key: str = ""  # hex AES-256 key of the link ("" = clear, for private transports)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Setup:
    """What this instance is in delivery: its role, inbox, publications and remote users."""

    role: str | None = None
    inbox: str = ""
    publications: dict[str, Publication] = field(default_factory=dict)
    links: dict[str, Link] = field(default_factory=dict)


def ensure_regions(db) -> None:
    for r in (PUBLICATION_REGION, STATE_REGION, CONFLICT_REGION):
        db.create_region(r)


def load(db) -> Setup:
    """The delivery setup of an open instance (empty if it has none)."""
    regions = db.regions()
    setup = Setup()
    if STATE_REGION not in regions:
        return setup
    me = db.get(STATE_REGION, SELF_KEY)
    if me:
        setup.role, setup.inbox = me.get("role"), me.get("inbox", "")
    for (name,), row in db.items(PUBLICATION_REGION):
        setup.publications[name] = Publication(name, list(row["regions"]), row.get("subscribe_by"))
    for key, row in db.items(STATE_REGION):
        if len(key) == 2 and key[1] == "def" and key[0] != ".":
            setup.links[key[0]] = Link(**row)
    return setup


def send_state(db, user: str) -> SendState:
    row = db.get(STATE_REGION, (user, "out"))
    return SendState(**row) if row else SendState()


def receive_state(db, user: str) -> ReceiveState:
    row = db.get(STATE_REGION, (user, "in"))
    return ReceiveState(**row) if row else ReceiveState()


def state_op(user: str, half: str, state: SendState | ReceiveState) -> tuple:
    """The update that stores one half of a user's row (to commit alone or with applied data)."""
    return (SET, STATE_REGION, (user, half), encode_value(state.to_dict()))


def def_op(link: Link) -> tuple:
    return (SET, STATE_REGION, (link.user, "def"), encode_value(asdict(link)))


def publication_op(pub: Publication) -> tuple:
    return (SET, PUBLICATION_REGION, (pub.name,), encode_value(asdict(pub)))


def self_op(role: str, inbox: str) -> tuple:
    return (SET, STATE_REGION, SELF_KEY, encode_value({"role": role, "inbox": inbox}))


def origin_user(updates) -> str | None:
    """The remote user a journaled transaction was received from (its ``(user, "in")`` row), if any."""
    for u in updates:
        if u.region == STATE_REGION and len(u.key) == 2 and u.key[1] == "in":
            return u.key[0]
    return None


def check_name(what: str, name: str) -> str:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_." for c in name) or name == ".":
        raise DeliveryConfigError(f"{what} {name!r} must be letters, digits, '-', '_' or '.'")
    return name


def keep_journal_for(db, user: str, confirm_sent: int) -> None:
    """Make ``multisite prune`` keep the journal ``user`` may still need: the segment holding
    ``confirm_sent`` and every later one (a resend starts there), as a consumer mark
    (``instance.consumers``) named ``delivery-USER`` at the seqno before that segment."""
    from ..instance import consumers
    from ..journal.offsets import split_offset
    from ..journal.segments import list_segments

    index = split_offset(confirm_sent)[0]
    firsts = [i.first_seqno for i in list_segments(db.layout.journal) if i.index == index]
    mark = firsts[0] - 1 if firsts else 0
    consumers.record(db.layout, f"delivery-{user}", mark)
