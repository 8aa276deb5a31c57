"""``multisite journal archive``: sealed segments and index pieces copied to a local path and to a real
S3-compatible server (moto in server mode, its own process on a free port), checked by CRC; what is
archived is what ``journal prune`` requires. The SIGKILL-mid-copy case is in tests/faults."""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

import multisite
from multisite.cli.main import cli
from multisite.errors import ArchiveCorrupt, ArchiveError, ConfigError
from multisite.instance import archives
from multisite.instance.layout import Layout
from multisite.instance.maintenance import prune
from multisite.journal.segments import list_segments
from multisite.pipeline.archive import Target, archive, check
from multisite.testing.s3server import S3Server, running_s3

SEGMENT_BYTES = 64 * 1024
PAD = "p" * 2000


def journaled(path: Path, n: int, start: int = 1) -> Path:
    root = path if (path / "journal").exists() else multisite.create(path, name=path.name, durability="none",
                                                                      segment_bytes=SEGMENT_BYTES)
    with multisite.open(root) as db:
        if "r" not in db.regions():
            db.create_region("r", schema='{"n": "long"}')
        for i in range(start, start + n):
            db.set("r", ("k", i % 50), {"n": i, "pad": PAD})
    return root


def sealed(root: Path):
    infos = list_segments(Layout.existing(root).journal)
    return infos[:-1], infos


@pytest.fixture(scope="module")
def s3():
    if not S3Server.available():
        pytest.skip("moto[server] is not installed (pip install 'moto[server]')")
    with running_s3("lake") as server:
        yield server


def test_sealed_segments_are_copied_once_each_checked_and_recorded_for_prune(tmp_path):
    a = journaled(tmp_path / "A", 200)
    segs, infos = sealed(a)
    assert len(segs) >= 4
    dest = tmp_path / "arch"
    rep = archive(str(a), str(dest))
    assert rep.segments_copied == [s.path.name for s in segs]
    assert rep.last_archived == infos[-1].first_seqno - 1 and rep.first_archived == 1
    for s in segs:  # byte copies
        assert (dest / "segments" / s.path.name).read_bytes() == s.path.read_bytes()
    man = json.loads((dest / "archive.json").read_text())
    assert [s["name"] for s in man["segments"]] == rep.segments_copied and man["instance"] == "A"
    assert archives.load_all(Layout.existing(a))[0].last_archived == rep.last_archived
    assert archive(str(a), str(dest)).segments_copied == []  # nothing new: nothing copied
    journaled(a, 100, start=201)
    rep2 = archive(str(a), str(dest))
    assert rep2.segments_copied and rep2.segments_copied[0] > rep.segments_copied[-1]
    assert check(str(dest)).damaged == []


def test_a_complete_copy_left_unrecorded_by_a_crash_is_recorded_without_copying_again(tmp_path):
    a = journaled(tmp_path / "A", 120)
    segs, _ = sealed(a)
    dest = tmp_path / "arch"
    archive(str(a), str(dest))
    man = json.loads((dest / "archive.json").read_text())
    journaled(a, 120, start=121)
    new, _ = sealed(a)
    nxt = new[len(segs)]
    shutil.copyfile(nxt.path, dest / "segments" / nxt.path.name)  # copied, the run killed before recording it
    (dest / "segments" / f".{new[len(segs) + 1].path.name}.tmp-999").write_bytes(b"half")  # a killed local write
    rep = archive(str(a), str(dest))
    assert rep.segments_recorded == [nxt.path.name] and nxt.path.name not in rep.segments_copied
    assert not list((dest / "segments").glob(".*"))
    after = json.loads((dest / "archive.json").read_text())
    assert after["segments"][:len(man["segments"])] == man["segments"]  # the earlier ones untouched
    assert [s["name"] for s in after["segments"]] == [s.path.name for s in new]


def test_prune_keeps_unarchived_segments_when_archiving_is_required(tmp_path):
    a = journaled(tmp_path / "A", 200)
    with pytest.raises(ConfigError, match="archiving is required but no journal archive is recorded"):
        prune(a, 10_000, require_archived=True)
    segs, infos = sealed(a)
    # archive only the first two segments (an archiver that stopped there)
    dest = tmp_path / "arch"
    archive(str(a), str(dest))
    held = list_segments(Layout.existing(a).journal)[2].first_seqno - 1
    archives.record(Layout.existing(a), str(dest), held)
    rep = prune(a, 10_000)
    assert rep.removed == [s.path.name for s in segs[:2]]
    assert rep.limit_seqno == held + 1 and "journal archive" in rep.reason
    out = CliRunner().invoke(cli, ["journal", "prune", str(a), "--before", "100000", "--no-require-archived"])
    assert out.exit_code == 0, out.output
    assert len(list_segments(Layout.existing(a).journal)) == 1


def test_s3_archive_by_the_command_line_and_a_corrupt_object_named_by_check(tmp_path, s3):
    a = journaled(tmp_path / "A", 150)
    segs, infos = sealed(a)
    r = CliRunner()
    out = r.invoke(cli, ["journal", "archive", str(a), "--to", "s3://lake/journals/A", "--json"])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output)
    assert rep["segments_copied"] == [s.path.name for s in segs] and rep["last_archived"] == infos[-1].first_seqno - 1
    tgt = Target("s3://lake/journals/A")
    assert tgt.read(f"segments/{segs[1].path.name}") == segs[1].path.read_bytes()
    out = r.invoke(cli, ["journal", "archive", str(a), "--to", "s3://lake/journals/A", "--check"])
    assert out.exit_code == 0 and "0 damaged" in out.output, out.output
    data = bytearray(segs[1].path.read_bytes())
    data[5000] ^= 0xFF  # one flipped byte in the archived copy
    tgt.put(f"segments/{segs[1].path.name}", bytes(data))
    out = r.invoke(cli, ["journal", "archive", str(a), "--to", "s3://lake/journals/A", "--check"])
    assert out.exit_code == 1
    assert f"s3://lake/journals/A/segments/{segs[1].path.name}" in out.output and "ARCHIVE_CORRUPT" in out.output
    with pytest.raises(ArchiveCorrupt, match=segs[1].path.name):  # a reader fetching it refuses it too
        from multisite.pipeline.archive import local_copy

        local_copy(f"s3://lake/journals/A/segments/{segs[1].path.name}", len(data),
                   zlib.crc32(segs[1].path.read_bytes()))


def test_an_archive_refuses_another_instance_and_a_gap(tmp_path):
    a = journaled(tmp_path / "A", 150)
    b = journaled(tmp_path / "B", 150)
    archive(str(a), str(tmp_path / "arch"))
    out = CliRunner().invoke(cli, ["journal", "archive", str(b), "--to", str(tmp_path / "arch")])
    assert out.exit_code == 1 and "holds instance A's journal, not B's" in out.output
    c = journaled(tmp_path / "C", 150)
    prune(c, 60, require_archived=False)
    archive(str(c), str(tmp_path / "archC"))  # an archive may start where the journal starts now
    journaled(c, 300, start=151)
    segs = list_segments(Layout.existing(c).journal)
    prune(c, segs[-3].first_seqno, require_archived=False)  # pruned past what was archived
    with pytest.raises(ArchiveError, match="were pruned before they were archived"):
        archive(str(c), str(tmp_path / "archC"))
