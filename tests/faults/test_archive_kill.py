"""The journal archiver SIGKILLed in the middle of copying a segment to S3 (a real moto server, its own
process) resumes without copying again what it had archived and without skipping anything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib

import pytest

import multisite
from multisite.instance.layout import Layout
from multisite.journal.segments import list_segments
from multisite.pipeline.archive import Target, archive
from multisite.testing.s3server import S3Server, running_s3

SEGMENT_BYTES = 512 * 1024
RATE_BYTES_PER_S = 1024 * 1024  # two segments a second: the kill lands inside a copy


@pytest.fixture
def s3():
    if not S3Server.available():
        pytest.skip("moto[server] is not installed (pip install 'moto[server]')")
    with running_s3("lake") as server:
        yield server


def test_sigkill_mid_copy_resumes_without_recopying_or_skipping(tmp_path, s3):
    root = multisite.create(tmp_path / "A", name="A", durability="none", segment_bytes=SEGMENT_BYTES)
    with multisite.open(root) as db:
        db.create_region("r")
        for i in range(4000):
            db.set("r", ("k", i % 100), "x" * 2000)
    infos = list_segments(Layout.existing(root).journal)
    sealed = infos[:-1]
    assert len(sealed) >= 10
    url = "s3://lake/A"
    tgt = Target(url)
    proc = subprocess.Popen([sys.executable, "-c", "from multisite.cli.main import main; main()", "journal", "archive",
                             str(root), "--to", url,
                             "--rate-bytes-per-s", str(RATE_BYTES_PER_S), "--json"],
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait for 3 archived segments, then kill inside the 4th copy
            man = tgt.load_manifest()
            if man and len(man["segments"]) >= 3:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the archiver archived nothing in 60 s: " + proc.stderr.read().decode())
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    before = tgt.load_manifest()["segments"]
    assert 3 <= len(before) < len(sealed), "the kill was meant to land mid-way"
    rep = archive(str(root), url)
    names = [s.path.name for s in sealed]
    done = [s["name"] for s in before]
    assert not set(rep.segments_copied) & set(done)  # nothing archived before the kill is copied again
    assert done == names[:len(done)]
    assert sorted(rep.segments_recorded + rep.segments_copied) == names[len(done):]
    after = tgt.load_manifest()["segments"]
    assert after[:len(before)] == before
    assert [s["name"] for s in after] == names  # nothing skipped, in order
    for s, info in zip(after, sealed):
        data = info.path.read_bytes()
        assert tgt.size_crc(s["path"]) == (len(data), zlib.crc32(data)) == (s["bytes"], s["crc32"])
    nxt = [s["first_seqno"] for s in after[1:]]
    assert nxt == [s["last_seqno"] + 1 for s in after[:-1]]  # contiguous seqnos
    assert json.loads((root / "archives" / os.listdir(root / "archives")[0]).read_text())["last_archived"] == \
        infos[-1].first_seqno - 1
