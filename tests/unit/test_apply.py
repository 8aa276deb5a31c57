"""The engine's apply of received frames (BC): the primary's bytes journaled as they came, in order,
exactly once, and nothing applied from a batch that cannot be applied whole."""

from __future__ import annotations

import pytest

import multisite
from multisite.errors import JournalGap, TransactionError
from multisite.journal.reader import iter_frames
from multisite.journal.records import (FRAME_HEADER_SIZE, SET, FrameRun, Record, Update, decode_payload,
                                      encode_record, frame)


def frames_of(root) -> list[tuple[int, bytes]]:
    return list(iter_frames(root / "journal", whole=True))


@pytest.fixture
def primary(tmp_path):
    """A primary with 11 transactions on three keys."""
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    with multisite.open(root) as db:
        db.create_region("acct")
        for i in range(11):
            db.set("acct", ("k", i % 3), {"i": i})
    return root


@pytest.fixture
def secondary(tmp_path):
    root = multisite.create(tmp_path / "B", name="B", durability="fsync")
    db = multisite.open(root)
    db.update_info(lambda i: setattr(i, "role", "secondary"))
    yield db
    db.close()


def as_another_encoder_wrote_it(fr: bytes) -> bytes:
    """The same record, in a valid msgpack that is not msgspec's (its seqno as a uint32, as another
    version's encoder may write it): decoding and re-framing it would give other bytes."""
    payload = fr[FRAME_HEADER_SIZE:]
    assert payload[:1] == b"\x96" and payload[1] < 0x80  # a 6-array, then the seqno as a fixint
    return frame(payload[1], b"\x96\xce" + payload[1].to_bytes(4, "big") + payload[2:])


def test_the_primarys_frames_are_journaled_byte_for_byte(primary, secondary):
    got = frames_of(primary)
    got[0] = (1, as_another_encoder_wrote_it(got[0][1]))
    assert decode_payload(got[0][1][FRAME_HEADER_SIZE:]) == decode_payload(frames_of(primary)[0][1][FRAME_HEADER_SIZE:])
    seen: list[tuple[int, bytes]] = []
    secondary.commit_listeners.append(lambda first, frs: seen.extend((first + i, bytes(fr)) for i, fr in enumerate(frs)))
    secondary.apply_frames([FrameRun.of(got[:1])])
    assert secondary.apply_frames([FrameRun.of(got[1:5]), FrameRun.of(got[5:])]) == 11
    assert frames_of(secondary.layout.root) == got
    assert seen == got  # the journal pool gets the same bytes, to feed a further secondary
    assert [secondary.get("acct", ("k", i)) for i in range(3)] == [{"i": 9}, {"i": 10}, {"i": 8}]


def test_frames_applied_before_are_skipped_and_a_gap_applies_nothing(primary, secondary):
    got = frames_of(primary)
    secondary.apply_frames([FrameRun.of(got[:4])])
    assert secondary.apply_frames([FrameRun.of(got[:6])]) == 6  # 1..4 again (a resend), then 5, 6
    with pytest.raises(JournalGap, match="at seqno 6; received seqno 8 leaves a gap"):
        secondary.apply_frames([FrameRun.of(got[7:])])
    with pytest.raises(JournalGap, match="at seqno 7; received seqno 9 leaves a gap"):
        secondary.apply_frames([FrameRun.of(got[6:7]), FrameRun.of(got[8:])])  # 7 applies, then 9: undone
    assert secondary.seqno == 6 and secondary.get("acct", ("k", 0)) == {"i": 3}
    assert secondary.apply_frames([FrameRun.of(got[6:7]), FrameRun.of(got[7:])]) == 11
    assert frames_of(secondary.layout.root) == got


def test_a_batch_that_cannot_be_applied_whole_applies_nothing(secondary):
    good = encode_record(Record(1, 0, 1, "A", 1.0, [Update(SET, "acct", ("k",), b"\x01")]))
    bad_op = encode_record(Record(2, 0, 2, "A", 1.0, [Update(9, "acct", ("k",), None)]))
    with pytest.raises(TransactionError, match="update 9 to region 'acct' is not one of set"):
        secondary.apply_frames([FrameRun.of([(1, good), (2, bad_op)])])
    assert secondary.seqno == 0 and secondary.regions() == {} and frames_of(secondary.layout.root) == []
    seqno_two = encode_record(Record(3, 0, 3, "A", 1.0, []))
    with pytest.raises(TransactionError, match="frame for seqno 2 holds the record of seqno 3"):
        secondary.apply_frames([FrameRun.of([(1, good), (2, seqno_two)])])
    assert secondary.seqno == 0 and frames_of(secondary.layout.root) == []
