"""`pipeline stream` never ends silently (`stream_sink.await_stream`, with stand-ins for Spark's
StreamingQuery): a query that died with an exception, one whose exception was lost (a fatal JVM error
such as the StackOverflowError seen in regex code ends the query's thread so) and one that ended by
itself when only a stop could end it are each a PipelineError naming why; a run that finished or was
stopped at its time is not."""

from __future__ import annotations

import pytest

from multisite.errors import PipelineError
from multisite.pipeline.stream_sink import await_stream


class Query:
    """What await_stream uses of pyspark's StreamingQuery."""

    def __init__(self, *, ends: bool = True, raises: Exception | None = None, exception=None, message: str = ""):
        self.ends, self.raises, self._exception = ends, raises, exception
        self.isActive = not ends
        self.status = {"message": message, "isDataAvailable": False, "isTriggerActive": False}
        self.stopped = False

    def awaitTermination(self, timeout=None):
        if self.raises is not None:
            self.isActive = False
            raise self.raises
        return self.ends if timeout is not None else None

    def stop(self):
        self.stopped, self.isActive = True, False

    def exception(self):
        return self._exception


def what():
    return "the stream of A into /lake/A (after 3 batch(es), 12 row(s))"


class StreamingQueryException(Exception):
    pass


def test_a_query_that_died_says_why():
    q = Query(raises=StreamingQueryException("[STREAM_FAILED] Query terminated with exception: boom\n"
                                             "=== Streaming Query ===\n..."))
    with pytest.raises(PipelineError, match=r"\(after 3 batch\(es\), 12 row\(s\)\) stopped: its query died: "
                                            r"\[STREAM_FAILED\] Query terminated with exception: boom$"):
        await_stream(q, available_now=False, seconds_s=None, what=what)


def test_an_exception_recorded_after_the_wait_is_said_too():
    q = Query(exception=StreamingQueryException("java.lang.StackOverflowError"))
    with pytest.raises(PipelineError, match="its query died: java.lang.StackOverflowError"):
        await_stream(q, available_now=True, seconds_s=None, what=what)


def test_a_status_that_tells_an_exception_is_an_error_even_without_one():
    q = Query(message="Terminated with exception: java.lang.StackOverflowError")
    with pytest.raises(PipelineError, match="stopped: Terminated with exception: java.lang.StackOverflowError"):
        await_stream(q, available_now=True, seconds_s=None, what=what)


@pytest.mark.parametrize("seconds_s", [None, 30.0])
def test_a_stream_that_ends_by_itself_with_nothing_recorded_is_an_error(seconds_s):
    q = Query(ends=True, message="Stopped")
    with pytest.raises(PipelineError, match="ended by itself, with no error recorded by Spark.*StackOverflowError"):
        await_stream(q, available_now=False, seconds_s=seconds_s, what=what)


def test_a_finished_available_now_run_and_a_timed_stop_are_fine():
    await_stream(Query(ends=True, message="Stopped"), available_now=True, seconds_s=None, what=what)
    q = Query(ends=False, message="Waiting for data to arrive")
    await_stream(q, available_now=False, seconds_s=5.0, what=what)
    assert q.stopped
