"""Deterministic simulation of whole topologies in one process, from a seed (issue 28).

Each family's real sans-IO cores are driven through a simulated network (delay, loss, duplication,
reordering, partitions), simulated processes (a crash at any step, a restart from what was durably
written), a simulated disk (a torn last write, ENOSPC, EIO on fsync) and skewed clocks. Every choice
comes from the seed; invariants are checked after every step; a failure prints its seed and the
shortest step list that reproduces it. See DESIGN.md beside this file.

    from multisite.testing.sim import run_seed, FAMILIES
    print(run_seed(FAMILIES["log_shipping"], seed=7, n_steps=400).report())

``python -m multisite.testing.sim --seeds 1000`` (``make sim SEEDS=1000``) runs seeds on every family
and prints a summary table.
"""

from __future__ import annotations

from .core import SeedResult, Stats, Violation, run_seed
from .families import FAMILIES, replay_steps

__all__ = ["FAMILIES", "SeedResult", "Stats", "Violation", "replay_steps", "run_seed"]
