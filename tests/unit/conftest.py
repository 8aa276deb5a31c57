"""Fixtures for the unit tier: real instance directories in a temporary folder, nothing mocked."""

from __future__ import annotations

import pytest
from hypothesis import settings

import multisite

# No per-example deadline: these tests touch real files, and a busy CI machine must not turn a slow
# fsync into a failure. Property failures still fail.
settings.register_profile("multisite", deadline=None)
settings.load_profile("multisite")


@pytest.fixture
def inst(tmp_path):
    """A new, empty instance directory (fsync durability; tests that need speed ask for another)."""
    return multisite.create(tmp_path / "A", name="A")


@pytest.fixture
def db(tmp_path):
    """An open instance with a replicated region ``acct`` and an unreplicated region ``scratch``."""
    root = multisite.create(tmp_path / "A", name="A", durability="none")
    d = multisite.open(root)
    d.create_region("acct")
    d.create_region("scratch", replicated=False)
    yield d
    d.close()
