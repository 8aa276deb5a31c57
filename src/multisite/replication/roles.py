"""Role changes and resynchronization of an open instance (used by the CLI and the instance server).

- ``change_role``: primary (originating: accepts application updates, starts a new history record)
  or secondary (replicating: only its Update Process writes; its history follows its source).
- ``resync_instance``: ``--resync SEQNO`` rolls back to a given point; ``--fetchresync HOST:PORT``
  asks the (new) primary for its history, finds the common point as a Receiver Server would, and
  rolls back to it. Both are no-ops when the instance is not ahead.
"""

from __future__ import annotations

from ..errors import ConfigError, GroupMismatch, HistoryMismatch, NoFreeStream, RollbackError
from ..instance.instance_file import ROLES, InstanceFile
from ..protocol.messages import Hello, RefusalCode
from .history import Refusal, check_pair, hello_for, is_si, si_hello_for, si_stream_for
from .resync import local_target_for_stream
from ..engine import RollbackReport


def change_role(db, role: str) -> InstanceFile:
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}, got {role!r}")

    def upd(info: InstanceFile) -> None:
        if info.role == role:
            return
        info.role = role
        if role == "primary":  # it now originates: a new range with a new identity
            info.add_history(db.seqno + 1, info.name, "originating")

    db.update_info(upd)
    return db.info


def resync_instance(db, resync: int | None = None, primary: Hello | None = None,
                    address: str = "") -> RollbackReport:
    """Roll back to ``resync``, or to the common point with ``primary`` (its Hello, fetched from
    ``address`` by the caller: see ``server.client.fetch_hello``)."""
    if (resync is None) == (primary is None):
        raise ConfigError("give exactly one of --resync SEQNO or --fetchresync HOST:PORT")
    if resync is not None:
        if resync < 0 or resync > db.seqno:
            raise RollbackError(f"--resync {resync} is past the end of {db.name}, which is at seqno {db.seqno}; "
                                f"nothing was changed")
        return db.rollback(resync, reason=f"--resync {resync}")
    info = db.info
    # SI: the stream of the primary's group (as its Receiver Server would choose it)
    stream = si_stream_for(info, primary.group) if is_si(primary.supplementary, info.supplementary) else None
    if isinstance(stream, Refusal):
        refusal = stream
    elif stream is not None:
        group = info.streams[stream].source_group if stream in info.streams else None
        refusal = check_pair(primary, si_hello_for(info, db.stream_seqno(stream), stream=stream),
                             si_source_group=group)
    else:
        refusal = check_pair(primary, hello_for(info, db.seqno))
    if refusal is None:
        return RollbackReport(db.name, db.seqno, db.seqno, 0, None, 0.0)
    if refusal.code is not RefusalCode.ROLLBACK_NEEDED:
        cls = {RefusalCode.GROUP_MISMATCH: GroupMismatch, RefusalCode.NO_FREE_STREAM: NoFreeStream}.get(
            refusal.code, HistoryMismatch)
        raise cls(f"cannot resynchronize {db.name} with {primary.name}: {refusal.message}")
    target = (refusal.common_seqno if stream is None
              else local_target_for_stream(db, stream, refusal.common_seqno))
    return db.rollback(target, reason=f"fetchresync from {primary.name} at {address}",
                       common_seqno=refusal.common_seqno, common_stream=stream)
