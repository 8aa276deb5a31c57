"""Running a replication filter: an external command over pipes, or a function in this process.

``Filter.apply(run)`` takes a run of journal frames and returns the filtered run, or raises
``FilterError`` naming the seqno the filter failed on (and then nothing of the run is used). The
documents, their codecs and the checks are ``replication.filters``' (pure); this module only moves
bytes to and from the filter process.

An external filter is started on first use and kept for the link's session. A batch is pipelined:
its documents are written while the answers are read (with one selector over both pipes, so a filter
that answers before it has read everything cannot deadlock against us), and the filter has
``timeout_s`` to give each next answer. End of its output, a closed input, no answer in time or an
answer out of step: the process is SIGKILLed (with its process group) and the failure raised; the
next session starts a new one. Its stderr goes to ``stderr_path`` (beside the server's logs).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from ...errors import ConfigError, FilterError
from ...fsutil import create_file
from ...journal.records import FrameRun
from ..filters import AnswerReader, FilterSpec, encode_message, filter_run, function_answerer, load_function

WRITE_CHUNK_BYTES = 64 * 1024
READ_CHUNK_BYTES = 256 * 1024
CLOSE_TIMEOUT_S = 1.0


class Filter:
    """One link's filter (``spec``), named ``name`` in errors and logs (e.g. "out-filter for B")."""

    def __init__(self, spec: FilterSpec, name: str, log: logging.Logger, stderr_path: Path | None = None):
        self.spec, self.name, self.log, self.stderr_path = spec, name, log, stderr_path
        self.label = f"{name} `{spec.text}`"
        self._proc: subprocess.Popen | None = None
        self._reader: AnswerReader | None = None
        self._fn = load_function(spec.function) if spec.in_process else None
        self.filtered = 0  # transactions through this filter
        self.starts = 0  # external processes started
        self._used = threading.local()  # per calling thread: the process its batch went to

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def apply(self, run: FrameRun) -> FrameRun:
        """The filtered run (blocking: call it from a worker thread)."""
        if self._fn is not None:
            out = filter_run(run, function_answerer(self._fn, self.label), self.label)
        else:
            self._used.proc = None
            try:
                out = filter_run(run, self._answer, self.label)
            except FilterError:
                # Only the process this batch went to: a session that ended mid-batch leaves its
                # worker thread running here, and the next session's process is not its to kill.
                self._kill(self._used.proc)
                raise
        self.filtered += len(out)
        return out

    def check(self) -> None:
        """Fail now (``ConfigError``) if the filter cannot even start: at ``source|receiver start``."""
        if self._fn is None:
            self._start()

    # -- the external process --------------------------------------------------------------------
    def _start(self) -> subprocess.Popen:
        if self._proc is not None:
            return self._proc
        err = open(create_file(self.stderr_path), "ab") if self.stderr_path else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(self.spec.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                          bufsize=0, start_new_session=True, close_fds=True)
        except OSError as e:
            raise ConfigError(f"cannot start {self.label}: {e.strerror or e}") from None
        finally:
            if err is not subprocess.DEVNULL:
                err.close()
        os.set_blocking(self._proc.stdin.fileno(), False)
        os.set_blocking(self._proc.stdout.fileno(), False)
        self._reader = AnswerReader(self.spec.fmt, self.label)
        self.starts += 1
        self.log.info("%s started (pid %d, %s)", self.label, self._proc.pid, self.spec.fmt)
        return self._proc

    def _answer(self, first_seqno: int, docs: list[dict]) -> list[Any]:
        try:
            proc = self._start()
        except ConfigError as e:
            raise FilterError(f"{e.message} (at seqno {first_seqno})") from None
        self._used.proc = proc
        if proc.poll() is not None:  # it died since the last batch: a crash, not a fresh start
            raise FilterError(self._died(proc, first_seqno))
        reader = self._reader
        reader.expect(first_seqno)
        data = memoryview(b"".join(encode_message(d, self.spec.fmt) for d in docs))
        sent, want, answers = 0, len(docs), []
        win, rout = proc.stdin.fileno(), proc.stdout.fileno()
        timeout_s = self.spec.timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(rout, selectors.EVENT_READ)
            if data:
                sel.register(win, selectors.EVENT_WRITE)
            deadline = time.monotonic() + timeout_s
            while len(answers) < want:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FilterError(f"{self.label} gave no answer for seqno {first_seqno + len(answers)} within "
                                      f"{timeout_s:g} s (filter_timeout_s): it hangs")
                for key, _ in sel.select(left):
                    if key.fd == win:
                        try:
                            sent += os.write(win, data[sent:sent + WRITE_CHUNK_BYTES])
                        except BrokenPipeError:
                            raise FilterError(self._died(proc, first_seqno + len(answers))) from None
                        except BlockingIOError:
                            continue
                        if sent == len(data):
                            sel.unregister(win)
                    else:
                        try:
                            chunk = os.read(rout, READ_CHUNK_BYTES)
                        except BlockingIOError:
                            continue
                        if not chunk:
                            raise FilterError(self._died(proc, first_seqno + len(answers)))
                        got = reader.feed(chunk)
                        if got:
                            answers += got
                            deadline = time.monotonic() + timeout_s
        # A surplus here is refused by ``filter_run``; one still on its way, by the next ``expect``.
        return answers

    def _died(self, proc: subprocess.Popen, seqno: int) -> str:
        try:
            code = proc.wait(CLOSE_TIMEOUT_S) if proc is not None else None
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            how = "closed its output"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        where = f"; its stderr is in {self.stderr_path}" if self.stderr_path else ""
        return f"{self.label} {how} at seqno {seqno}{where}"

    def kill(self) -> None:
        """SIGKILL the process (and anything it started); the next batch starts a new one."""
        self._kill(self._proc)

    def _kill(self, proc: subprocess.Popen | None) -> None:
        if proc is None:
            return
        if self._proc is proc:
            self._proc = None
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        """End the process: close its input (a clean end for a well-behaved filter), then kill it."""
        proc = self._proc
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(CLOSE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()

    def status(self) -> dict:
        return {**self.spec.to_dict(), "filter_pid": self.pid, "filtered": self.filtered,
                "filter_starts": self.starts}
