"""What every simulated family shares: steps, clocks, the invariant failure, and replay with shrinking.

A family (``shipping.py``, ``grid.py``, ...) is an object with a ``name``, ``generate(seed, n)``
(the list of steps a seed means) and ``replay(seed, steps)`` (runs them against the real cores,
checking invariants after every step; raises ``Violation``). Steps are plain tuples that carry every
choice they need (which node, how many bytes, how many milliseconds): replay uses no random numbers,
so that any sub-list of a failing list can be replayed on its own. That is what makes shrinking
possible: ``run_seed`` replays the prefix up to the failing step, then drops steps one chunk at a
time while the same invariant still fails, and reports the shortest list found.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Protocol

Step = tuple

SHRINK_REPLAYS_MAX = 400  # replays spent shrinking one failure: a bound on the wall time a failing seed costs


class Violation(AssertionError):
    """An invariant broke after step ``index`` (set by the family's replay)."""

    def __init__(self, invariant: str, detail: str, index: int = -1):
        super().__init__(f"{invariant}: {detail}")
        self.invariant, self.detail, self.index = invariant, detail, index


class Family(Protocol):
    name: str

    def generate(self, seed: int, n: int) -> list[Step]: ...

    def replay(self, seed: int, steps: list[Step]) -> Stats: ...


@dataclass
class Stats:
    """What one replay did: steps run and transactions committed (the speed figure's unit)."""

    steps: int = 0
    txns: int = 0
    notes: dict[str, int] = field(default_factory=dict)

    def note(self, what: str, n: int = 1) -> None:
        self.notes[what] = self.notes.get(what, 0) + n


@dataclass
class SeedResult:
    family: str
    seed: int
    stats: Stats
    violation: Violation | None = None
    shrunk: list[Step] | None = None
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.violation is None

    def report(self) -> str:
        """The failure as a reader replays it: the seed, the invariant, the shortest step list."""
        if self.ok:
            return f"{self.family} seed {self.seed}: ok ({self.stats.steps} steps, {self.stats.txns} txns)"
        v = self.violation
        lines = [f"{self.family} seed {self.seed}: INVARIANT {v.invariant} broken: {v.detail}",
                 (f"  shortest step list ({len(self.shrunk or [])} steps; replay with "
                  f"multisite.testing.sim.replay_steps({self.family!r}, {self.seed}, STEPS)):")]
        lines += [f"    {s!r}," for s in self.shrunk or []]
        return "\n".join(lines)


def rng_for(seed: int, what: str) -> random.Random:
    """A generator of its own for one purpose of one seed (steps, configuration): adding a draw for one
    purpose does not change the others'."""
    return random.Random(f"{seed}:{what}")


class Clock:
    """A node's clock as it reads it: the true simulated time seen through an offset and a rate
    (skew and drift). Monotonic as long as the true time is."""

    def __init__(self, offset_s: float = 0.0, rate: float = 1.0):
        self.offset_s, self.rate = offset_s, rate

    def read(self, true_s: float) -> float:
        return self.offset_s + true_s * self.rate


def _fails(family: Family, seed: int, steps: list[Step], invariant: str) -> bool:
    try:
        family.replay(seed, steps)
    except Violation as v:
        return v.invariant == invariant
    return False


def shrink(family: Family, seed: int, steps: list[Step], invariant: str) -> list[Step]:
    """The shortest list found that still breaks ``invariant``: the prefix to the failing step, then
    chunks removed (halves, quarters, ... single steps) while it still fails (delta debugging, one
    pass per chunk size, within ``SHRINK_REPLAYS_MAX`` replays)."""
    budget = getattr(family, "shrink_replays", SHRINK_REPLAYS_MAX)
    chunk = max(1, len(steps) // 2)
    while chunk >= 1 and budget > 0:
        i = 0
        while i < len(steps) and budget > 0:
            trial = steps[:i] + steps[i + chunk:]
            budget -= 1
            if trial and _fails(family, seed, trial, invariant):
                steps = trial
            else:
                i += chunk
        chunk //= 2
    return steps


def run_seed(family: Family, seed: int, n_steps: int, *, shrink_failures: bool = True) -> SeedResult:
    """Generate ``n_steps`` steps for ``seed``, replay them with invariants checked after each; on a
    failure, shrink it to the shortest step list that still fails the same way."""
    steps = family.generate(seed, n_steps)
    t0 = time.perf_counter()
    try:
        stats = family.replay(seed, steps)
    except Violation as v:
        prefix = steps[:v.index + 1] if v.index >= 0 else steps
        shrunk = shrink(family, seed, prefix, v.invariant) if shrink_failures else prefix
        return SeedResult(family.name, seed, Stats(steps=v.index + 1), v, shrunk, time.perf_counter() - t0)
    return SeedResult(family.name, seed, stats, wall_s=time.perf_counter() - t0)


class World(Protocol):
    stats: Stats

    def apply(self, step: Step) -> None: ...

    def check(self) -> None: ...

    def finish(self) -> None: ...


def drive(world: World, steps: list[Step]) -> Stats:
    """Apply each step and check the invariants after it; then ``finish`` (heal, settle, the final
    checks). A core raising where it should not (an IndexError, an assertion of its own) is a
    violation too, of ``no-unexpected-exception``, with the traceback's last line."""
    for i, step in enumerate(steps):
        _guarded(i, step, world.apply)
        _guarded(i, step, lambda _s: world.check())
        world.stats.steps += 1
    _guarded(len(steps) - 1, ("finish",), lambda _s: world.finish())
    return world.stats


def _guarded(i: int, step: Step, fn) -> None:
    try:
        fn(step)
    except Violation as v:
        v.index = i
        raise
    except Exception as e:
        import traceback
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise Violation("no-unexpected-exception", f"step {step!r} raised {type(e).__name__}: {e} "
                        f"(at {where.filename.rsplit('/', 2)[-1]}:{where.lineno})", i) from e
