"""The fuzz targets of ``fuzz/`` (``make fuzz``, issue 28) stay runnable: every parser has one, each
target's seeds are real inputs that parse without a crash, and a few hundred seeded mutations of them
run clean (the millions run outside CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fuzz.mutate import fuzz  # noqa: E402
from fuzz.run import targets  # noqa: E402

TARGETS = targets()


def test_every_parser_has_a_target():
    assert {"protocol_connection", "protocol_packed", "protocol_client", "journal_segment", "journal_lostfile",
            "delivery_message", "multimaster_wire", "multimaster_document", "grid_wire", "grid_shard_wire",
            "config_toml", "grid_policy_toml", "multimaster_couch"} <= set(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seeds_and_a_few_mutations_run_clean(name, tmp_path):
    t = TARGETS[name]
    for s in t.seeds():
        t.one(s)
    assert fuzz(t, 300, seed=1, out=tmp_path)["crashes"] == {}
