"""An index piece of a journal archive on a local or mounted path is read in place: it must be checked
against the manifest's CRC as a fetched S3 object is, or a damaged piece gives wrong rows, or an Arrow
error naming no file."""

from __future__ import annotations

import json
import shutil

import pytest

import multisite
from multisite.errors import ArchiveCorrupt
from multisite.pipeline.archive import archive
from multisite.pipeline.journal_frames import index_journal
from multisite.pipeline.plan import chunks, instance_ref
from multisite.pipeline.segment_index import chunk_batches, journal_schema


def journaled(path):
    """An instance with several sealed segments of 64 KiB."""
    root = multisite.create(path, name="A", durability="none", segment_bytes=64 * 1024)
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(120):
            db.set("r", ("k", i), "p" * 2000)
    return root


def cut_last_frame(seg) -> None:
    """Cut an archived segment at the start of its last frame (a copy that stopped short)."""
    from multisite.journal.segments import SegmentInfo, SegmentView, read_header

    with SegmentView(SegmentInfo(seg, read_header(seg))) as view:
        last_frame = [off for off, _ in view.frames(tail=False)][-1]
    with open(seg, "r+b") as f:
        f.truncate(last_frame)


def test_a_damaged_piece_of_a_local_archive_is_named_not_read(tmp_path):
    root = journaled(tmp_path / "A")
    index_journal(str(root), jobs=1)
    dest = tmp_path / "arch"
    archive(str(root), str(dest))
    man = json.loads((dest / "archive.json").read_text())
    assert len(man["pieces"]) >= 2
    ref = instance_ref(str(dest))

    def seqnos() -> list[int]:
        out: list[int] = []
        for c in chunks(ref, 1, None):
            for b in chunk_batches(c, journal_schema(["seqno"], {}), regions=None, region_schemas={}, fields={}):
                out += b.column(0).to_pylist()
        return out

    whole = seqnos()
    # The first piece's file replaced by the second's (a mix-up, or damage that still parses): read in
    # place without a check, its seqnos fell outside the chunk's and its rows vanished without a word.
    first = dest / man["pieces"][0]["path"]
    shutil.copyfile(dest / man["pieces"][1]["path"], first)
    with pytest.raises(ArchiveCorrupt, match=str(first)):
        assert seqnos() == whole


def test_damaged_frame_headers_of_a_local_archive_are_named_not_compared(tmp_path):
    # An export compares its transactions' CRCs with the archived frame headers to find a rollback.
    # Read in place unchecked, a damaged headers file gave wrong CRCs: a rollback that never happened
    # (the export retracts what follows) or wrong CRCs recorded for the next comparison.
    from multisite.pipeline.plan import journal_crcs, ref_crcs

    root = journaled(tmp_path / "A")
    dest = tmp_path / "arch"
    rep = archive(str(root), str(dest))
    ref = instance_ref(str(dest))
    live = journal_crcs(str(root), 1, rep.last_archived)
    assert [a.tolist() for a in ref_crcs(ref, 1, rep.last_archived)] == [a.tolist() for a in live]
    heads = dest / json.loads((dest / "archive.json").read_text())["segments"][0]["headers"]["path"]
    data = bytearray(heads.read_bytes())
    data[8] ^= 0xFF  # the first frame's payload CRC
    heads.write_bytes(bytes(data))
    with pytest.raises(ArchiveCorrupt, match=str(heads)):
        ref_crcs(ref, 1, rep.last_archived)


def test_an_archive_cache_another_user_owns_is_refused(tmp_path, monkeypatch):
    # Objects fetched from S3 are cached under /tmp/multisite-archive-cache, and a cached file of the
    # right size is read without a check. Another local user who made that directory first chose what
    # every later read took for the archive's bytes (file names follow from the manifest).
    import os

    from multisite.errors import ArchiveError
    from multisite.pipeline.archive import local_copy

    if os.getuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    planted = tmp_path / "cache"
    planted.mkdir()
    os.chown(planted, 65534, 65534)
    planted.chmod(0o777)
    (planted / "0000abcd-5-00000001.msj").write_bytes(b"EVIL!")
    monkeypatch.setenv("MULTISITE_ARCHIVE_CACHE", str(planted))
    with pytest.raises(ArchiveError, match=str(planted)):
        local_copy("s3://lake/A/segments/00000001.msj", 5, 0xABCD)


def test_a_truncated_segment_of_a_local_archive_is_named_by_a_local_state(tmp_path):
    # state_at (pipeline verify without Spark) walked an archived segment's frames to its end: cut at a
    # frame boundary (a copy that stopped short), its last records were left out of the state silently.
    from multisite.pipeline.local_state import state_at

    root = journaled(tmp_path / "A")
    dest = tmp_path / "arch"
    rep = archive(str(root), str(dest))
    state, at = state_at(str(dest))
    assert at == rep.last_archived and len(state) == rep.last_archived
    seg = dest / json.loads((dest / "archive.json").read_text())["segments"][0]["path"]
    cut_last_frame(seg)
    with pytest.raises(ArchiveCorrupt, match=str(seg)):
        state_at(str(dest))


def test_a_truncated_segment_of_a_local_archive_is_named_by_a_read_starting_inside_it(tmp_path):
    # A read starting inside an archived segment walks its frame headers to plan chunks: cut at a frame
    # boundary, the walk ended early and the segment's last records were left out without a word.
    root = journaled(tmp_path / "A")
    dest = tmp_path / "arch"
    archive(str(root), str(dest))
    rec = json.loads((dest / "archive.json").read_text())["segments"][0]
    seg = dest / rec["path"]
    cut_last_frame(seg)
    ref = instance_ref(str(dest))
    with pytest.raises(ArchiveCorrupt, match=str(seg)):
        cs = chunks(ref, 2, rec["last_seqno"])
        assert max(c.last_seqno for c in cs) == rec["last_seqno"]


def test_the_directories_a_local_archive_creates_are_made_durable(tmp_path, monkeypatch):
    # The archive's directories were made with mkdir(parents=True) and their parents never fsynced:
    # after a power loss the archive could be gone while the instance's mark (fsynced) still let prune
    # remove the segments it held. (A power loss cannot be staged here: the fsyncs are what is checked.)
    import multisite.fsutil as fsutil

    root = journaled(tmp_path / "A")
    synced = []
    real = fsutil.fsync_dir
    monkeypatch.setattr(fsutil, "fsync_dir", lambda d: (synced.append(str(d)), real(d))[1])
    dest = tmp_path / "mnt" / "archives" / "A"
    archive(str(root), str(dest))
    for d in (tmp_path, tmp_path / "mnt", tmp_path / "mnt" / "archives", dest):
        assert str(d) in synced, f"{d} not fsynced after an entry was made in it"


def test_an_archive_cache_that_is_another_users_link_is_refused(tmp_path, monkeypatch):
    # The owner check followed a symbolic link: another user's /tmp/multisite-archive-cache linking to a directory
    # of this user's (a home directory passes the check) was taken, and once the check had passed the other user
    # could point the link at their own directory, so the path handed to the reader opened their bytes.
    import os

    from multisite.errors import ArchiveError
    from multisite.pipeline.archive import local_copy

    if os.getuid() != 0:
        pytest.skip("making a link owned by another user needs root")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    (mine / "0000abcd-5-00000001.msj").write_bytes(b"EVIL!")  # what the link shows once it is switched
    link = tmp_path / "cache"
    link.symlink_to(mine)
    os.lchown(link, 65534, 65534)
    monkeypatch.setenv("MULTISITE_ARCHIVE_CACHE", str(link))
    with pytest.raises(ArchiveError, match=str(link)):
        local_copy("s3://lake/A/segments/00000001.msj", 5, 0xABCD)
