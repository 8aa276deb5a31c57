"""How many worker processes `journal index` starts when not told: the usable cores, at most
INDEX_JOBS_MAX, and no more than the available memory holds (issue 29: it died with BrokenProcessPool
under load with one worker per host core)."""

from __future__ import annotations

from multisite.pipeline.journal_frames import INDEX_JOBS_MAX, INDEX_WORKER_BYTES, default_index_jobs

GIB = 1024 ** 3


def test_the_default_is_bounded_by_cores_by_a_maximum_and_by_memory():
    assert default_index_jobs(None, cores=2) == 2
    assert default_index_jobs(None, cores=64) == INDEX_JOBS_MAX
    assert default_index_jobs(100 * GIB, cores=4) == 4
    assert default_index_jobs(3 * INDEX_WORKER_BYTES, cores=64) == 3
    assert default_index_jobs(INDEX_WORKER_BYTES // 2, cores=64) == 1  # never none


def test_the_default_counts_the_cores_this_process_may_use():
    import os

    assert default_index_jobs(None) == min(len(os.sched_getaffinity(0)), INDEX_JOBS_MAX)
