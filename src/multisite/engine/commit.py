"""Local commits: apply a transaction's updates to the store and journal them (GT.M's order, SPEC §1).

All under the commit lock, which also fixes seqno order:

1. each update is applied to the store's open SQLite transaction, reading its before-image first;
2. the journal record (seqno, stream tag, origin, time, updates with before-images) is framed and
   written to the journal; in ``fsync`` mode it is hardened here;
3. the frame is handed to the commit listeners (the journal pool that feeds Source Servers).

``fsync`` and ``none`` commit one transaction at a time (``commit``); ``group`` combines concurrent
commits (``group.GroupCommit``) and hardens each batch outside the lock. If a journal write fails
(a full disk) the store is undone to the savepoint, so the failed transaction leaves no trace.
"""

from __future__ import annotations

from typing import Any

from ..errors import KeyTypeError, NotPrimary, TransactionError
from ..journal.records import KILL, SET, ZKILL, Update
from ..keys import decode_key, encode_key
from .core import REQUEST, Core

OPS = frozenset((SET, KILL, ZKILL))
_ABSENT = object()  # a key the store does not hold (None is a value a key can hold)
Op = tuple[int, str, tuple, "bytes | None"]  # (opcode, region, key, encoded value or None)


def commit(core: Core, ops: list[Op]) -> int:
    """Apply ``ops`` atomically (``fsync`` and ``none`` modes); the seqno, 0 if nothing replicated
    was touched."""
    with core.lock:
        core.check_open()
        snap = core.savepoint()
        try:
            seqno, data = prepare(core, ops)
            if data:
                core.write([(seqno, data)])
        except BaseException:
            core.undo(snap)
            raise
        core.release()
        core.maybe_flush()
    return seqno


def prepare_each(core: Core, txns: list[list[Op]], frames: list[tuple[int, bytes]]) -> list[int | Exception]:
    """Under the commit lock: prepare transactions one by one, each in a store savepoint of its own,
    so that one that fails leaves nothing behind and the others go on. Appends the frames; returns
    each transaction's seqno (0: nothing replicated) or the exception that refused it alone."""
    st = core.store
    out: list[int | Exception] = []
    for ops in txns:
        st.savepoint(REQUEST)
        try:
            seqno, data = prepare(core, ops)
        except Exception as e:  # this transaction only
            st.rollback_to(REQUEST)
            out.append(e)
            continue
        st.release(REQUEST)
        out.append(seqno)
        if data:
            frames.append((seqno, data))
    return out


def prepare_sets(core: Core, txns: list[list[Op]], frames: list[tuple[int, bytes]]) -> list[int | Exception] | None:
    """Under the commit lock: the common batch (on a primary, every transaction only sets keys of
    existing regions) read with one query per region for its before-images and written with one
    statement per region, instead of a savepoint, a read and a write for each transaction. Every
    SQLite call lets the GIL go, and with many committing threads the committer then waits for its
    turn to take it back: the calls per batch, more than their work, bound group commit. Appends the
    frames; returns each transaction's seqno or the exception that refused it alone (its sets are
    undone); None, having done nothing, for any other batch."""
    st = core.store
    regions = st.regions
    if core.info.role != "primary" or core.lease_ended() or not _only_sets(txns, regions):
        return None  # a fenced primary: prepare_each refuses each transaction
    if len(txns) == 1 and len(txns[0]) == 1:
        return [_prepare_one_set(core, txns[0][0], frames)]
    out: list[int | Exception] = [0] * len(txns)
    keyed: list[tuple[int, list[Op], list[bytes]]] = []
    for i, ops in enumerate(txns):
        try:
            keyed.append((i, ops, [encode_key(op[2]) for op in ops]))
        except KeyTypeError as e:  # a string subscript that is not text: this transaction only
            out[i] = e
    wanted: dict[int, list[bytes]] = {}
    for _, ops, kbs in keyed:
        for op, kb in zip(ops, kbs):
            reg = regions[op[1]]
            if reg.replicated:
                wanted.setdefault(reg.id, []).append(kb)
    current = {rid: st.get_many(rid, kbs) for rid, kbs in wanted.items()}  # before-images, kept current
    written: dict[int, dict[bytes, bytes]] = {}
    for i, ops, kbs in keyed:
        undo: list[tuple[dict, bytes, Any]] = []  # what to put back if the transaction fails
        updates: list[Update] = []
        touched: set[str] = set()
        for (_, region, key, vb), kb in zip(ops, kbs):
            reg = regions[region]
            if reg.replicated:
                cur = current[reg.id]
                before = cur.get(kb, _ABSENT)
                updates.append(Update(SET, region, key, vb, None if before is _ABSENT else before))
                touched.add(region)
                undo.append((cur, kb, before))
                cur[kb] = vb
            w = written.setdefault(reg.id, {})
            undo.append((w, kb, w.get(kb, _ABSENT)))
            w[kb] = vb
        try:
            seqno, data = core.seal(updates, touched)
        except Exception as e:  # this transaction only (a record over the limit): undo its sets
            _undo_sets(undo)
            out[i] = e
            continue
        out[i] = seqno
        if data:
            frames.append((seqno, data))
    for rid, w in written.items():
        if w:
            st.put_values(rid, w)
    return out


def _prepare_one_set(core: Core, op: Op, frames: list[tuple[int, bytes]]) -> int | Exception:
    """``prepare_sets`` for a batch of one transaction of one set (2 client connections taking turns:
    nearly every batch): one read of the before-image, the record sealed, then one write, without
    the batch's dicts and lists (issue 27). The same outcome as the general loop: the seqno, or the
    exception that refused it (a key that is not one, a record over the limit) with nothing written."""
    _, region, key, vb = op
    st = core.store
    reg = st.regions[region]
    try:
        kb = encode_key(key)
    except KeyTypeError as e:
        return e
    seqno = 0
    if reg.replicated:
        before = st.get(reg.id, kb)
        try:
            seqno, data = core.seal([Update(SET, region, key, vb, before)], (region,))
        except Exception as e:  # noqa: BLE001 - this transaction only (a record over the limit): nothing written
            return e
        frames.append((seqno, data))
    st.put(reg.id, kb, vb)
    return seqno


def _only_sets(txns: list[list[Op]], regions: dict[str, Any]) -> bool:
    """Whether every update of the batch sets a key of an existing region: the one batch
    ``prepare_sets`` takes (anything else needs the general path, with its savepoints and checks)."""
    for ops in txns:
        for op in ops:
            if op[0] != SET or op[1] not in regions:
                return False
    return True


def _undo_sets(undo: list[tuple[dict, bytes, Any]]) -> None:
    """Put back, newest first, what one transaction of ``prepare_sets`` changed in its before-images
    and pending writes (it failed alone: a rare branch, kept out of the batch's loop)."""
    for d, kb, old in reversed(undo):
        if old is _ABSENT:
            del d[kb]
        else:
            d[kb] = old


def prepare(core: Core, ops: list[Op], *, origin: str | None = None, stream: int = 0,
            stream_seqno: int | None = None, replicated_apply: bool = False,
            commit_time: float | None = None) -> tuple[int, bytes]:
    """Under the commit lock: apply to the store, assign the seqno, frame the journal record."""
    core.check_open()
    if core.lease_until is not None and not replicated_apply:
        core.check_lease()
    st = core.store
    regions = st.regions
    for op in ops:
        if op[0] not in OPS:
            raise _not_an_update(op)
        r = regions.get(op[1])
        if r is None:
            if not replicated_apply:
                core.region(op[1])
        elif r.replicated and not replicated_apply and core.info.role != "primary":
            raise _not_primary(core, op[1])
    updates: list[Update] = []
    touched: set[str] = set()
    i, n = 0, len(ops)
    while i < n:
        opc, region, key, vb = ops[i]
        r = regions.get(region) or st.create_region(region, True)
        if opc == SET:  # a run of sets in one region: one read of before-images, one write
            j = i + 1
            while j < n and ops[j][0] == SET and ops[j][1] == region:
                j += 1
            run = ops[i:j]
            kbs = [encode_key(o[2]) for o in run]
            if r.replicated:
                cur = st.get_many(r.id, kbs)
                add = updates.append
                for o, kb in zip(run, kbs):
                    vb = o[3]
                    add(Update(SET, region, o[2], vb, cur.get(kb)))
                    cur[kb] = vb
                st.put_values(r.id, cur)  # now every key of the run with its last value
            else:
                st.put_values(r.id, {kb: o[3] for o, kb in zip(run, kbs)})
            i = j
        else:
            kb = encode_key(key)
            if opc == KILL:
                if r.replicated:
                    killed = [(decode_key(k), v) for k, v in st.subtree(r.id, kb)]
                    updates.append(Update(KILL, region, key, None, None, killed))
                st.delete_subtree(r.id, kb)
            else:
                if r.replicated:
                    updates.append(Update(ZKILL, region, key, None, st.get(r.id, kb)))
                st.delete(r.id, kb)
            i += 1
        if r.replicated:
            touched.add(region)
    # A received transaction with no updates (a filter emptied it) still takes its seqno: seqnos and
    # stream seqnos stay contiguous, as they do when BC keeps the primary's frame.
    return core.seal(updates, touched, origin=origin, stream=stream, stream_seqno=stream_seqno,
                     commit_time=commit_time, keep_empty=replicated_apply)


def _not_an_update(op: Op) -> TransactionError:
    """What refuses an update whose opcode is none of set, kill or zkill (built only then)."""
    return TransactionError(f"update {op[0]!r} to region {op[1]!r} is not one of set ({SET}), kill "
                            f"({KILL}) or zkill ({ZKILL})")


def _not_primary(core: Core, region: str) -> NotPrimary:
    """What refuses an application update to a replicated region on a secondary (built only then)."""
    return NotPrimary(f"instance {core.name} is a replicating secondary: it accepts no "
                      f"application updates to replicated region {region!r}; write to its primary")

