"""Where a journal archive lives, and how readers fetch from it (the archiver itself is ``archive``).

An archive URL is a local or mounted path (``/mnt/archive/A``, ``file:///…``) or S3-compatible object
storage (``s3://bucket/prefix``, endpoint and credentials from the environment, see ``s3_filesystem``).
``Target`` hides the difference behind ``pyarrow.fs``: sizes, CRC-32s, whole reads, and writes that show
either nothing or the whole file under its final name (``fsutil.atomic_write`` on a path, one upload on
an object store, an interrupted upload deleted: ``Target._abandon``). Its errors tell an outage worth
trying again (``ArchiveUnreachable``, see ``transient``) from one that stays, and never carry credentials.

Readers (``plan``, ``decode``, ``local_state``) open archived files through ``local_copy``: an object is
fetched once into a local cache (``MULTISITE_ARCHIVE_CACHE``, default under the temp dir, refused unless
it is this user's own) and checked against the manifest's CRC; a local archive is read in place.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import time
import urllib.parse
import zlib
from pathlib import Path

from ..errors import ArchiveCorrupt, ArchiveError, ArchiveUnreachable, ConfigError
from ..fsutil import atomic_write, ensure_dir

FORMAT = 1
MANIFEST = "archive.json"
SEGMENTS_DIR = "segments"
HEADERS_DIR = "headers"
INDEX_DIR = "index"
BLOCK_BYTES = 4 * 1024 * 1024  # bytes per write (and per throttle step) of a copy
MANIFEST_READ_ATTEMPTS = 4  # reads of a manifest that is not JSON before it is called corrupt (see load_manifest)
MANIFEST_RETRY_S = 0.05  # the pause before the next read grows by this much each time
TRANSIENT = ("NETWORK_CONNECTION", "curlCode", "could not connect", "connection refused", "connection reset",
             "timed out", "timeout", "HTTP status 0", "HTTP status 5", "SERVICE_UNAVAILABLE", "SLOW_DOWN",
             "INTERNAL_FAILURE", "THROTTLING", "REQUEST_TIME")  # an object store's errors worth trying again


def transient(message: str) -> bool:
    """Whether an object store's error is one that passes (the network, a 5xx, throttling), as opposed to
    one that stays until someone acts (no such bucket, access denied, a bad key)."""
    m = re.sub(r"'[^']*'", "''", message).lower()  # not the words of the key or bucket it quotes
    return any(t.lower() in m for t in TRANSIENT)


def redact(message: str) -> str:
    """``message`` without the credentials a URL in it may carry (``scheme://user:secret@host``)."""
    return re.sub(r"(\w+://)[^/@\s]+@", r"\1", message)


def is_url(path: str) -> bool:
    return "://" in str(path)


def is_archive(path: str) -> bool:
    """Whether ``path`` names a journal archive (an ``s3://`` URL, or a directory holding a manifest)."""
    p = str(path)
    if p.startswith("s3://"):
        return True
    local = urllib.parse.urlparse(p).path if p.startswith("file://") else p
    return (Path(local) / MANIFEST).exists()


def s3_filesystem():
    """An ``S3FileSystem`` from the environment (endpoint, credentials, region)."""
    from pyarrow import fs

    env = os.environ
    kw: dict = {"region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"}
    endpoint = env.get("MULTISITE_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        u = urllib.parse.urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        kw["endpoint_override"], kw["scheme"] = u.netloc, u.scheme
    if env.get("AWS_ACCESS_KEY_ID"):
        kw["access_key"], kw["secret_key"] = env["AWS_ACCESS_KEY_ID"], env.get("AWS_SECRET_ACCESS_KEY", "")
        if env.get("AWS_SESSION_TOKEN"):
            kw["session_token"] = env["AWS_SESSION_TOKEN"]
    return fs.S3FileSystem(**kw)


class Target:
    """An archive location: ``pyarrow.fs`` and the base path under it."""

    def __init__(self, url: str):
        from pyarrow import fs

        self.url = str(url)
        u = urllib.parse.urlparse(self.url)
        if u.scheme == "s3":
            if not u.netloc:
                raise ConfigError(f"archive URL {url} names no bucket: use s3://BUCKET/PREFIX")
            self.fs, self.base, self.local = s3_filesystem(), (u.netloc + u.path).rstrip("/"), False
        elif u.scheme in ("", "file"):
            if u.netloc not in ("", "localhost"):
                raise ConfigError(f"archive URL {url} names host {u.netloc!r}: a local path is file:///PATH "
                                  f"(three slashes)")
            self.fs, self.local = fs.LocalFileSystem(), True
            self.base = str(Path(u.path if u.scheme else self.url).absolute())
        else:
            raise ConfigError(f"archive URL {url}: scheme {u.scheme!r} is not supported (a path, file:// or s3://)")

    def path(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    def display(self, rel: str) -> str:
        return self.path(rel) if self.local else f"s3://{self.path(rel)}"

    def _err(self, what: str, e: Exception) -> ArchiveError:
        cls = ArchiveUnreachable if not self.local and transient(str(e)) else ArchiveError
        return cls(redact(f"journal archive {self.url}: cannot {what} ({e})"))

    def size(self, rel: str) -> int | None:
        from pyarrow import fs

        try:
            info = self.fs.get_file_info(self.path(rel))
        except OSError as e:
            raise self._err(f"look at {rel}", e) from None
        return info.size if info.type == fs.FileType.File else None

    def size_crc(self, rel: str) -> tuple[int, int] | None:
        """``(size, crc32)`` of an archived file, read whole; None if it does not exist."""
        if self.size(rel) is None:
            return None
        crc, n = 0, 0
        try:
            with self.fs.open_input_stream(self.path(rel)) as f:
                while True:
                    block = f.read(BLOCK_BYTES)
                    if not block:
                        break
                    crc, n = zlib.crc32(block, crc), n + len(block)
        except OSError as e:
            raise self._err(f"read {rel}", e) from None
        return n, crc

    def read(self, rel: str) -> bytes | None:
        if self.size(rel) is None:
            return None
        try:
            with self.fs.open_input_stream(self.path(rel)) as f:
                return f.read()
        except OSError as e:
            raise self._err(f"read {rel}", e) from None

    def put(self, rel: str, data: bytes, throttle=None) -> None:
        """Write ``data`` under ``rel`` so that the name shows either nothing or all of it."""
        try:
            if self.local:
                dest = Path(self.path(rel))
                for d in reversed([d for d in (dest.parent, *dest.parent.parents) if not d.exists()]):
                    ensure_dir(d)  # its parent fsynced: the archive survives a power loss as the mark does
                if throttle:
                    for off in range(0, len(data), BLOCK_BYTES):
                        throttle(min(BLOCK_BYTES, len(data) - off))
                atomic_write(dest, data)
                return
            out = self.fs.open_output_stream(self.path(rel))  # the object appears at close
            try:
                for off in range(0, len(data), BLOCK_BYTES):
                    if throttle:
                        throttle(min(BLOCK_BYTES, len(data) - off))
                    out.write(data[off:off + BLOCK_BYTES])
            except BaseException:
                self._abandon(out, rel, data)
                raise
            out.close()
        except OSError as e:
            raise self._err(f"write {rel}", e) from None

    def _abandon(self, out, rel: str, data: bytes) -> None:
        """Give up an upload that failed or was interrupted mid-way. pyarrow (26) has no abort for its S3
        output stream: after a failed part the stream's close fails and the multipart upload stays
        incomplete (invisible; the bucket's lifecycle rule ``AbortIncompleteMultipartUpload`` removes
        it), but after an interruption (Ctrl-C in a throttle pause) close -- which Arrow also runs on
        destruction -- completes it with the bytes written so far. Such a partial object is deleted
        (no manifest names it, and a run compares size and CRC before taking a copy); a partial
        manifest is written again whole (it was about to be replaced by ``data``)."""
        try:
            out.close()
            if self.fs.get_file_info(self.path(rel)).size not in (None, len(data)):
                if rel == MANIFEST:
                    with self.fs.open_output_stream(self.path(rel)) as again:
                        again.write(data)
                else:
                    self.fs.delete_file(self.path(rel))
        except OSError:
            pass

    def sweep_temp(self) -> None:
        """Remove temp files a local copy killed mid-write left (they never carry a final name)."""
        if not self.local:
            return
        for sub in (SEGMENTS_DIR, HEADERS_DIR, INDEX_DIR, "."):
            d = Path(self.path(sub))
            for p in d.glob(".*.tmp-*") if d.is_dir() else []:
                p.unlink(missing_ok=True)

    def load_manifest(self) -> dict | None:
        """The archive's manifest (None where there is none). An archiver replaces it while readers read
        it, and an S3 read takes the object's size first and its bytes after: a read that met a
        replacement in between is torn, so bytes that are not JSON are read again a few times before
        the manifest is called corrupt."""
        for attempt in range(MANIFEST_READ_ATTEMPTS):
            raw = self.read(MANIFEST)
            if raw is None:
                return None
            try:
                man = json.loads(raw)
                break
            except ValueError as e:
                err = e
                time.sleep(MANIFEST_RETRY_S * (attempt + 1))
        else:
            raise ArchiveCorrupt(f"the manifest {self.display(MANIFEST)} of the journal archive is not JSON ({err}; "
                                 f"read {MANIFEST_READ_ATTEMPTS} times)")
        if man.get("format") != FORMAT:
            raise ArchiveError(f"the journal archive {self.url} has format {man.get('format')!r}, this version reads "
                               f"{FORMAT}")
        return man

    def save_manifest(self, man: dict) -> None:
        self.put(MANIFEST, json.dumps(man, indent=1).encode())


# -- reading ------------------------------------------------------------------------------------------

def cache_dir() -> Path:
    return Path(os.environ.get("MULTISITE_ARCHIVE_CACHE") or Path(tempfile.gettempdir()) / "multisite-archive-cache")


def local_copy(url: str, nbytes: int, crc: int, *, verify: bool = False) -> str:
    """A local path holding the archived file ``url`` (``s3://…``), fetched once and checked by CRC;
    a local archive's file is its own path (checked by CRC with ``verify``: an index piece has no
    checksums of its own, a segment's frames have)."""
    if not url.startswith("s3://"):
        if verify:
            p = Path(url)
            data = p.read_bytes() if p.is_file() else None
            _check_fetched(url, data, nbytes, crc)
        return url
    d = cache_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.lstat()  # a link another user made could be switched once checked: its owner is checked
    st = d.stat() if stat.S_ISLNK(st.st_mode) and st.st_uid == os.getuid() else st
    if st.st_uid != os.getuid() or st.st_mode & 0o022:  # a cached file is taken for the archive's bytes
        raise ArchiveError(f"the journal archive cache {d} is not this user's own (owner uid {st.st_uid}, mode "
                           f"{st.st_mode & 0o777:o}): another user could plant files a read would take for archived "
                           f"ones; set MULTISITE_ARCHIVE_CACHE to a directory only you can write")
    dest = d / f"{crc:08x}-{nbytes}-{Path(url).name}"
    if dest.exists() and dest.stat().st_size == nbytes:
        return str(dest)
    base, rel = url[len("s3://"):].split("/", 1)[0], url[len("s3://"):].split("/", 1)[1]
    tgt = Target(f"s3://{base}")
    data = tgt.read(rel)
    _check_fetched(url, data, nbytes, crc)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, dest)  # a cache: rebuilt from the archive if lost, so no fsync
    return str(dest)


def _check_fetched(url: str, data: bytes | None, nbytes: int, crc: int) -> None:
    if data is None or len(data) != nbytes or zlib.crc32(data) != crc:
        problem = "missing" if data is None else f"CRC-32 {zlib.crc32(data):08x} over {len(data):,} bytes"
        raise ArchiveCorrupt(f"archived file {url} is damaged: {problem} where {crc:08x} over {nbytes:,} bytes was "
                             f"archived")


def local_files(chunk):
    """``chunk`` (of an archive) with its segment, or its piece, as local files (see ``local_copy``)."""
    import dataclasses

    if chunk.piece:
        return dataclasses.replace(chunk, piece=local_copy(chunk.piece, chunk.piece_bytes, chunk.piece_crc,
                                                           verify=True))
    return dataclasses.replace(chunk, path=local_copy(chunk.path, chunk.file_bytes, chunk.file_crc))


def manifest(url: str) -> dict:
    man = Target(url).load_manifest()
    if man is None:
        raise ArchiveError(f"{url} is not a journal archive (no {MANIFEST}); archive an instance there with "
                           f"multisite journal archive DIR --to {url}")
    return man


def file_url(url: str, rel: str) -> str:
    """The URL (``s3://…``) or local path of an archived file, as the readers open it."""
    tgt = Target(url)
    return tgt.display(rel)


def archived_crcs(url: str, man: dict, lo: int, hi: int):
    """``(seqnos, payload CRCs)`` of the archived frames in ``[lo, hi]``, from the archived headers."""
    import numpy as np

    tgt = Target(url)
    seqs, crcs = [], []
    for rec in man["segments"]:
        if rec["last_seqno"] < lo or rec["first_seqno"] > hi:
            continue
        h = rec["headers"]
        a = np.fromfile(local_copy(tgt.display(h["path"]), h["bytes"], h["crc32"], verify=True),
                        dtype="<i8").reshape(-1, 2)
        a = a[(a[:, 0] >= lo) & (a[:, 0] <= hi)]
        seqs.append(a[:, 0])
        crcs.append(a[:, 1])
    if not seqs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(seqs).astype(np.int64), np.concatenate(crcs).astype(np.int64)
