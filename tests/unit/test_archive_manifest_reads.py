"""Reading a journal archive's manifest while an archiver replaces it: an S3 read takes the object's
size, then its bytes, so a read that meets a replacement in between is torn. Such bytes are read again;
bytes that stay broken are a corrupt manifest, named."""

from __future__ import annotations

import json

import pytest

from multisite.errors import ArchiveCorrupt
from multisite.pipeline import archive as arch


class Reads(arch.Target):
    """A local archive whose manifest reads come from a script (what the S3 race produces)."""

    def __init__(self, url: str, script: list[bytes]):
        super().__init__(url)
        self.script = script

    def read(self, rel: str) -> bytes | None:
        return self.script.pop(0) if rel == arch.MANIFEST else super().read(rel)


def test_a_torn_manifest_read_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setattr(arch, "MANIFEST_RETRY_S", 0.0)
    whole = json.dumps({"format": arch.FORMAT, "segments": [], "pieces": []}).encode()
    t = Reads(str(tmp_path), [whole[: len(whole) // 2], whole])
    assert t.load_manifest()["segments"] == []
    assert t.script == []


def test_a_manifest_that_stays_broken_is_corrupt_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(arch, "MANIFEST_RETRY_S", 0.0)
    t = Reads(str(tmp_path), [b'{"format": '] * arch.MANIFEST_READ_ATTEMPTS)
    with pytest.raises(ArchiveCorrupt, match="archive.json"):
        t.load_manifest()
