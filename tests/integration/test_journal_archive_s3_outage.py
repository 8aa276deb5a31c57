"""``journal archive --follow`` against a real S3-compatible server (moto, its own process) that goes
away mid-follow and comes back on the same port: the follow logs each failed pass, naming the URL and
no credentials, tries again with a capped backoff and completes the archive, which then checks clean.
A permanent error (no such bucket) still stops it; an upload interrupted mid-way leaves no object."""

from __future__ import annotations

import threading
import time

import pytest

from multisite.errors import ArchiveError, ArchiveUnreachable
from multisite.instance import archives
from multisite.instance.layout import Layout
from multisite.pipeline.archive import BLOCK_BYTES, Target, archive, check
from multisite.testing.s3server import S3Server, running_s3

from .test_journal_archive import journaled, sealed


@pytest.fixture()
def s3():
    if not S3Server.available():
        pytest.skip("moto[server] is not installed (pip install 'moto[server]')")
    with running_s3("lake") as server:
        yield server


def archived(root) -> int:
    """What the instance's mark says the archive holds (0: nothing yet)."""
    marks = archives.load_all(Layout.existing(root), skip_unreadable=True)
    return marks[0].last_archived if marks else 0


def wait_for(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_follow_survives_the_store_going_away_and_completes_the_archive(tmp_path, s3):
    # A transient S3 error stopped --follow with a traceback-free ArchiveError: the archiver was gone.
    a = journaled(tmp_path / "A", 200)
    url = "s3://lake/journals/A"
    said: list[str] = []
    stop, errors = threading.Event(), []

    def run():
        try:
            archive(str(a), url, follow=True, interval_s=0.1, progress=said.append, should_stop=stop.is_set)
        except Exception as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    _, infos = sealed(a)
    wait_for(lambda: archived(a) == infos[-1].first_seqno - 1, 60, "the first segments")
    s3.down()
    journaled(a, 200, start=201)  # new segments sealed while the store is away
    wait_for(lambda: any("trying again" in m for m in said), 60, "a failed pass to be logged")
    assert not errors, errors
    s3.up()
    segs, infos = sealed(a)
    wait_for(lambda: archived(a) == infos[-1].first_seqno - 1 or errors,
             90, "the follow to archive what was sealed during the outage")
    stop.set()
    t.join(60)
    assert not errors, errors
    retries = [m for m in said if "trying again" in m]
    assert retries and all(url in m and "testing" not in m for m in retries), retries
    rep = check(url)
    assert rep.damaged == [] and rep.first_archived == 1 and rep.last_archived == infos[-1].first_seqno - 1
    assert rep.files == 2 * len(segs) + len(Target(url).load_manifest()["pieces"])


def test_a_missing_bucket_still_stops_the_follow(tmp_path, s3):
    a = journaled(tmp_path / "A", 200)
    with pytest.raises(ArchiveError, match="NO_SUCH_BUCKET") as e:
        archive(str(a), "s3://nobucket/A", follow=True, interval_s=0.1)
    assert not isinstance(e.value, ArchiveUnreachable)


def test_a_missing_bucket_stops_the_follow_whatever_words_its_prefix_holds(tmp_path, s3):
    # The error's text names the key: under a prefix holding "timeout" the missing bucket was taken for an
    # outage and the follow retried it for ever (here: until should_stop, without raising).
    a = journaled(tmp_path / "A", 200)
    deadline = time.monotonic() + 20
    with pytest.raises(ArchiveError, match="NO_SUCH_BUCKET") as e:
        archive(str(a), "s3://nobucket/timeout-drills/A", follow=True, interval_s=0.1,
                should_stop=lambda: time.monotonic() > deadline)
    assert not isinstance(e.value, ArchiveUnreachable)


def test_an_unreachable_store_without_follow_is_an_unreachable_error(tmp_path, s3):
    a = journaled(tmp_path / "A", 200)
    s3.down()
    try:
        with pytest.raises(ArchiveUnreachable, match=r"s3://lake/A: cannot .*NETWORK_CONNECTION"):
            archive(str(a), "s3://lake/A")
    finally:
        s3.up()


def test_an_upload_interrupted_mid_way_leaves_no_object(s3):
    # pyarrow completes a multipart upload on close: an interrupted put left the first block as the object.
    tgt = Target("s3://lake/partial")
    calls = []

    def throttle(nbytes):
        calls.append(nbytes)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tgt.put("segments/00000001.msj", b"x" * (2 * BLOCK_BYTES + 10), throttle)
    assert tgt.size("segments/00000001.msj") is None
