"""The grid's deployment policy: grid.toml read into a frozen value, every mistake named by file and key."""

from __future__ import annotations

import pytest

from multisite.errors import ConfigError, GridPolicyError
from multisite.grid.policy import MAX_PARTITIONS, GridPolicy, MapPolicy, load_policy, parse_policy, policy_from_dict

GOOD = """
name = "orders"
partitions = 8
min_sync = 1
max_sync = 2
max_async = 1
zones = ["a", "b", "c"]

[maps.accounts]
[maps.orders]
"""


def test_a_full_policy_reads_back(tmp_path):
    f = tmp_path / "grid.toml"
    f.write_text(GOOD)
    p = load_policy(f)
    assert (p.name, p.partitions, p.min_sync, p.max_sync, p.max_async) == ("orders", 8, 1, 2, 1)
    assert p.zones == ("a", "b", "c")
    assert p.maps == (MapPolicy("accounts"), MapPolicy("orders"))
    assert p.map_names == ("accounts", "orders")
    assert p.shards_per_partition == 4
    assert p.source == str(f)


def test_counts_default_to_zero_and_zones_to_none():
    p = parse_policy('name = "g"\npartitions = 1\n[maps.m]\n')
    assert (p.min_sync, p.max_sync, p.max_async, p.zones) == (0, 0, 0, None)
    assert p.shards_per_partition == 1


def test_to_dict_has_the_files_shape_and_reads_back_equal():
    p = parse_policy(GOOD, source="grid.toml")
    d = p.to_dict()
    assert d == {"name": "orders", "partitions": 8, "min_sync": 1, "max_sync": 2, "max_async": 1,
                 "zones": ["a", "b", "c"], "maps": {"accounts": {}, "orders": {}}}
    assert policy_from_dict(d) == p  # the source is not part of the policy's identity
    assert "zones" not in parse_policy('name = "g"\npartitions = 1\n[maps.m]\n').to_dict()


def test_the_policy_is_frozen_and_hashable():
    p = parse_policy(GOOD)
    with pytest.raises(AttributeError):
        p.partitions = 9
    assert len({p, parse_policy(GOOD)}) == 1


def test_map_lookup_names_the_missing_map_and_the_file():
    p = parse_policy(GOOD, source="g.toml")
    assert p.map("orders") == MapPolicy("orders")
    with pytest.raises(GridPolicyError, match=r"no map 'nope'.*\[maps.nope\] to g.toml"):
        p.map("nope")


def _bad(text: str) -> GridPolicyError:
    with pytest.raises(GridPolicyError) as e:
        parse_policy(text, source="grid.toml")
    assert e.value.path == "grid.toml" and "grid.toml" in str(e.value)
    assert isinstance(e.value, ConfigError) and isinstance(e.value, ValueError)
    assert e.value.code == "GRID_POLICY" and str(e.value).startswith("GRID_POLICY: ")
    return e.value


BASE = {"name": '"g"', "partitions": "4", "min_sync": "1", "max_sync": "1", "max_async": "0"}


def _text(**over: str | None) -> str:
    kv = {**BASE, **over}
    lines = [f"{k} = {v}" for k, v in kv.items() if v is not None]
    return "\n".join(lines) + "\n[maps.m]\n"


@pytest.mark.parametrize("over,key,words", [
    ({"min_sync": "2", "max_sync": "1"}, "min_sync", "more than max_sync"),
    ({"partitions": "0"}, "partitions", "must be 1.."),
    ({"partitions": str(MAX_PARTITIONS + 1)}, "partitions", f"1..{MAX_PARTITIONS}"),
    ({"partitions": None}, "partitions", "missing"),
    ({"max_async": "-1"}, "max_async", "cannot be negative"),
    ({"min_sync": "-1"}, "min_sync", "cannot be negative"),
    ({"max_sync": "-2", "min_sync": "0"}, "max_sync", "cannot be negative"),
    ({"partitions": '"8"'}, "partitions", "must be an integer, got str"),
    ({"partitions": "8.0"}, "partitions", "must be an integer, got float"),
    ({"min_sync": "true"}, "min_sync", "must be an integer, got bool"),
    ({"name": None}, "name", "missing"),
    ({"name": '""'}, "name", "must be a name"),
    ({"name": '"a b"'}, "name", "must be a name"),
    ({"name": "3"}, "name", "must be a name"),
    ({"min_sycn": "1"}, "min_sycn", "unknown key"),
    ({"zones": "[]"}, "zones", "non-empty list"),
    ({"zones": '"a"'}, "zones", "non-empty list"),
    ({"zones": '["a", "a"]'}, "zones", "twice"),
    ({"zones": '["a", 1]'}, "zones", "zone 1"),
    ({"zones": '["a"]'}, "zones", "cannot hold a primary and min_sync = 1"),
])
def test_a_bad_policy_names_the_key_and_the_file(over, key, words):
    e = _bad(_text(**over))
    assert e.key == key
    assert f"grid.toml: {key}: " in str(e)
    assert words in str(e)


def test_maps_are_required_and_checked():
    no_maps = "\n".join(f"{k} = {v}" for k, v in BASE.items())
    assert _bad(no_maps).key == "maps"
    assert _bad(no_maps + "\nmaps = {}\n").key == "maps"
    assert _bad(no_maps + '\nmaps = "m"\n').key == "maps"
    assert _bad(no_maps + "\nmaps = {m = 1}\n").key == "maps.m"
    assert _bad(no_maps + '\n[maps."bad name"]\n').key == "maps.bad name"
    e = _bad(no_maps + "\n[maps.m]\ncolour = 1\n")
    assert e.key == "maps.m.colour" and "unknown key" in str(e)
    e = _bad(no_maps + '\n[maps.m]\nloader = "pg"\n')
    assert e.key == "maps.m.loader" and '"sqlite", "postgresql" or "module:Class"' in str(e)
    e = _bad(no_maps + '\n[maps.m]\nloader = "sqlite"\n')
    assert e.key == "maps.m.path" and "missing" in str(e)
    e = _bad(no_maps + '\n[maps.m]\nloader = "sqlite"\npath = "a.db"\n[maps.n]\nloader = "sqlite"\npath = "b.db"\n')
    assert e.key == "maps" and "more than one database" in str(e)
    ok = parse_policy(no_maps + '\n[maps.m]\nloader = "postgresql"\ndsn = "host=x"\ntable = "t"\n')
    assert ok.maps[0].loader == "postgresql" and dict(ok.maps[0].settings) == {"dsn": "host=x", "table": "t"}
    assert parse_policy(no_maps + '\n[maps.m]\nloader = "pkg.mod:Cls"\nanything = 1\n').maps[0].loader


def test_toml_syntax_errors_and_unreadable_files_name_the_file(tmp_path):
    e = _bad("name = \n")
    assert "not valid TOML" in str(e)
    with pytest.raises(GridPolicyError, match="cannot read grid policy .*missing.toml"):
        load_policy(tmp_path / "missing.toml")
    f = tmp_path / "latin.toml"
    f.write_bytes(b'name = "\xe9"\n')
    with pytest.raises(GridPolicyError, match="latin.toml: not UTF-8"):
        load_policy(f)


def test_a_policy_built_in_code_is_checked_as_the_file_is():
    with pytest.raises(GridPolicyError, match="min_sync"):
        GridPolicy(name="g", partitions=2, min_sync=1, max_sync=0, maps=(MapPolicy("m"),))
    with pytest.raises(GridPolicyError, match="maps"):
        GridPolicy(name="g", partitions=2)


def test_a_policy_built_in_code_cannot_hide_a_mistake_from_the_checks():
    with pytest.raises(GridPolicyError, match="map twice"):
        GridPolicy(name="g", partitions=2, maps=(MapPolicy("m"), MapPolicy("m")))
    # "ab" would pass as zones ["a", "b"], then ``"ab" in policy.zones`` lets a container of zone "ab" in
    with pytest.raises(GridPolicyError, match="zones"):
        GridPolicy(name="g", partitions=2, zones="ab", maps=(MapPolicy("m"),))
