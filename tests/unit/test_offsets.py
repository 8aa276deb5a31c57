"""Stream offsets: one JSON form, with the CRC of each instance's last consumed record."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from multisite.pipeline.offsets import JournalOffset  # noqa: E402


def test_round_trip_with_crcs():
    off = JournalOffset.of({"B": 7, "A": 120}, {"A": 3735928559, "B": None})
    assert off.to_dict() == {"seqno": {"A": 120, "B": 7}, "crc": {"A": 3735928559}}
    again = JournalOffset.parse(str(off))
    assert again == off and again.get("A") == 120 and again.crc("A") == 3735928559 and again.crc("B") is None


def test_offsets_written_before_crcs_existed_still_parse():
    off = JournalOffset.parse('{"seqno": {"A": 5}}')
    assert off.get("A") == 5 and off.crc("A") is None and off.to_dict() == {"seqno": {"A": 5}}
    assert off.get("Z") == 0
