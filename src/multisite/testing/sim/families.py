"""The simulated families by name, and the replay of a printed step list."""

from __future__ import annotations

from .core import Family, Stats, Step
from .delivery import Delivery
from .grid import GridVote
from .ha import HaDecisions
from .multimaster import MultiMaster
from .shipping import LogShipping

FAMILIES: dict[str, Family] = {f.name: f for f in (LogShipping(), GridVote(), Delivery(), HaDecisions(), MultiMaster())}
STEPS_DEFAULT: dict[str, int] = {"log_shipping": 500, "grid_vote": 600, "delivery": 400, "ha": 500, "multimaster": 120}


def replay_steps(family: str, seed: int, steps: list[Step]) -> Stats:
    """Replay a step list (as a failure prints it): raises the same ``Violation``."""
    return FAMILIES[family].replay(seed, steps)
