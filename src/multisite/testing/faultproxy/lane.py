"""The faults and counters of one direction of the proxy, shared by all its connections.

A *lane* is one direction: ``upstream`` carries bytes from the client to the target, ``downstream``
from the target back to the client. Tests change a lane's faults at any time; every connection's
forwarding loop consults them per chunk, so a change applies to connections already open.

How a chunk crosses a lane (``proxy.py`` drives it):

1. the reading side stamps the chunk with its arrival time and queues it (bounded, so a stalled
   lane stops reading and TCP's own flow control pushes back on the sender);
2. ``release`` holds it while the lane is stalled and until ``arrival + delay_s``: latency is added
   to every chunk without serialising them, so a delay lowers throughput only through the bound;
3. ``filter`` discards bytes (the next ``drop_next_bytes``, then whole chunks with
   ``drop_probability``): the stream is corrupted on purpose, the receiver must notice;
4. ``slices`` and ``pace`` cap the rate at ``bandwidth_bytes_per_s``, across all connections.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

UPSTREAM = "upstream"
DOWNSTREAM = "downstream"
BOTH = "both"
DIRECTIONS = (UPSTREAM, DOWNSTREAM)

#: With a bandwidth cap, bytes go out in slices worth this much time, so that a cap is smooth
#: rather than one long sleep and one burst per chunk.
bandwidth_slice_s = 0.02


def lanes_for(direction: str) -> tuple[str, ...]:
    """The lane names a ``direction`` argument (``upstream``, ``downstream`` or ``both``) covers."""
    if direction == BOTH:
        return DIRECTIONS
    if direction in DIRECTIONS:
        return (direction,)
    raise ValueError(f"direction must be one of upstream, downstream, both; got {direction!r}")


class Lane:
    """Fault settings and byte counters for one direction."""

    def __init__(self, name: str, rng: random.Random) -> None:
        self.name = name
        self._rng = rng
        self.delay_s = 0.0
        self.drop_probability = 0.0
        self.drop_next_bytes = 0
        self.bandwidth_bytes_per_s: float | None = None
        self._flowing = asyncio.Event()  # cleared while stalled
        self._flowing.set()
        self._link_free_at = 0.0  # loop time at which the capped link has sent all it was given
        self.bytes_forwarded = 0
        self.bytes_dropped = 0

    # -- settings --------------------------------------------------------------------------

    def set_delay(self, delay_s: float) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.delay_s = float(delay_s)

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    def set_drop(self, probability: float | None, next_bytes: int | None) -> None:
        if probability is not None:
            if not 0.0 <= probability <= 1.0:
                raise ValueError(f"probability must be within [0, 1], got {probability}")
            self.drop_probability = float(probability)
        if next_bytes is not None:
            if next_bytes < 0:
                raise ValueError(f"next_bytes must be >= 0, got {next_bytes}")
            self.drop_next_bytes = int(next_bytes)

    def set_bandwidth(self, bytes_per_s: float | None) -> None:
        if bytes_per_s is not None and bytes_per_s < 0:
            raise ValueError(f"bytes_per_s must be >= 0 or None, got {bytes_per_s}")
        self.bandwidth_bytes_per_s = float(bytes_per_s) if bytes_per_s else None

    def heal(self) -> None:
        """Clear every fault of this lane (counters are kept)."""
        self.delay_s = 0.0
        self.drop_probability = 0.0
        self.drop_next_bytes = 0
        self.bandwidth_bytes_per_s = None
        self._flowing.set()

    def describe(self) -> dict:
        return {
            "bytes_forwarded": self.bytes_forwarded,
            "bytes_dropped": self.bytes_dropped,
            "delay_s": self.delay_s,
            "stalled": self.stalled,
            "drop_probability": self.drop_probability,
            "drop_next_bytes": self.drop_next_bytes,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
        }

    # -- forwarding steps ------------------------------------------------------------------

    async def release(self, arrival: float) -> None:
        """Return once the lane flows and the chunk that arrived at ``arrival`` is due."""
        loop = asyncio.get_running_loop()
        while True:
            await self._flowing.wait()
            wait_s = arrival + self.delay_s - loop.time()
            if wait_s <= 0:
                return  # no await since the flowing check: still flowing
            await asyncio.sleep(wait_s)

    def filter(self, chunk: bytes) -> bytes:
        """The part of ``chunk`` that survives the drop faults; counts what is discarded."""
        if self.drop_next_bytes:
            n = min(self.drop_next_bytes, len(chunk))
            self.drop_next_bytes -= n
            self.bytes_dropped += n
            chunk = chunk[n:]
        if chunk and self.drop_probability and self._rng.random() < self.drop_probability:
            self.bytes_dropped += len(chunk)
            chunk = b""
        return chunk

    def slices(self, chunk: bytes) -> Iterator[bytes]:
        """``chunk`` cut into slices of ``bandwidth_slice_s`` worth of the cap (whole if none)."""
        cap = self.bandwidth_bytes_per_s
        if not cap:
            yield chunk
            return
        step = max(1, int(cap * bandwidth_slice_s))
        view = memoryview(chunk)
        for i in range(0, len(chunk), step):
            yield bytes(view[i : i + step])

    async def pace(self, nbytes: int) -> None:
        """Wait until a link capped at ``bandwidth_bytes_per_s`` would have sent ``nbytes`` more."""
        cap = self.bandwidth_bytes_per_s
        if not cap:
            return
        now = asyncio.get_running_loop().time()
        self._link_free_at = max(now, self._link_free_at) + nbytes / cap
        await asyncio.sleep(self._link_free_at - now)
        await self._flowing.wait()  # a stall that began during the wait holds this slice too
