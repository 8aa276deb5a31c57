"""A grid's deployment policy: what ``grid.toml`` says, checked once, as a frozen value.

The file is flat TOML::

    name = "orders"          # the grid's name: a container of another grid is refused
    partitions = 8           # fixed for the grid's life: a key's partition is a hash modulo this
    min_sync = 1             # synchronous replicas that must vote commit before a primary commits
    max_sync = 1             # synchronous replicas placed per partition (at most)
    max_async = 1            # asynchronous replicas placed per partition (at most)
    zones = ["a", "b"]       # optional: no two shards of a partition in one zone

    [maps.accounts]          # one table per map (a region in every shard); settings come later
    [maps.orders]

Every error is a ``GridPolicyError`` naming the file and the key, so that the CLI can print it as it
is. Unknown keys are errors, not warnings: a misspelt ``min_sycn`` must not silently mean 0.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import GridPolicyError

MAX_PARTITIONS = 4096  # one instance directory per shard: more would be a file-handle problem, not a grid
MAX_REPLICAS = 16  # per kind (sync, async) and partition
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")

TOP_KEYS = ("name", "partitions", "min_sync", "max_sync", "max_async", "zones", "initial_containers", "maps")
MAX_INITIAL_CONTAINERS = 1024
MAP_KEYS: tuple[str, ...] = ("loader", "table")  # with a loader, its settings too (LOADER_KEYS)
RESERVED_MAP_KEYS: dict[str, str] = {}
LOADER_KEYS = {"sqlite": ("path", "synchronous"),
               "postgresql": ("dsn", "connect_timeout_s", "statement_timeout_ms")}  # "module:Class": any
LOADER_REQUIRED = {"sqlite": "path", "postgresql": "dsn"}


@dataclass(frozen=True)
class MapPolicy:
    """One map of the grid: a region of that name in every shard's instance."""

    name: str
    loader: str | None = None  # "sqlite", "postgresql" or "module:Class": the write-through Loader
    settings: tuple[tuple[str, Any], ...] = ()  # the loader's settings (table, path, dsn, ...)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.loader:
            d["loader"] = self.loader
            d.update(dict(self.settings))
        return d

    def database(self) -> tuple | None:
        """What names the map's database (the loader and its settings but the table)."""
        if not self.loader:
            return None
        return (self.loader, tuple(sorted((k, repr(v)) for k, v in self.settings if k != "table")))


@dataclass(frozen=True)
class GridPolicy:
    name: str
    partitions: int
    min_sync: int = 0
    max_sync: int = 0
    max_async: int = 0
    zones: tuple[str, ...] | None = None
    maps: tuple[MapPolicy, ...] = ()
    source: str = field(default="<policy>", compare=False)  # where it was read from, for messages
    # The first placement waits until this many containers are up (the seed's deployment policy's
    # numInitialContainers): the first to register would otherwise take every primary, and a grid
    # without replicas never moves a primary afterwards.
    initial_containers: int = 1

    def __post_init__(self) -> None:
        # The same checks as the file's, so that a policy built in code is as safe as one read. to_dict
        # is a dict of maps and a list of zones: what it would hide (a map twice, zones as one string,
        # read by ``in`` as substrings) is checked here first.
        names = [m.name for m in self.maps]
        if len(set(names)) != len(names):
            _fail(self.source, "maps", f"lists a map twice: {names}")
        if self.zones is not None and not isinstance(self.zones, tuple):
            _fail(self.source, "zones", f"must be a tuple of zone names, got {type(self.zones).__name__} "
                                        f"{self.zones!r}")
        _check(self.to_dict(), self.source)

    @property
    def shards_per_partition(self) -> int:
        """Shards a fully placed partition has: the primary and every replica."""
        return 1 + self.max_sync + self.max_async

    @property
    def map_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.maps)

    def map(self, name: str) -> MapPolicy:
        for m in self.maps:
            if m.name == name:
                return m
        raise GridPolicyError(f"grid {self.name!r} has no map {name!r} (maps: {', '.join(self.map_names)}); "
                              f"add [maps.{name}] to {self.source}", path=self.source, key=f"maps.{name}")

    def to_dict(self) -> dict[str, Any]:
        """The policy in the shape of the file (and of ``grid status --json``)."""
        d: dict[str, Any] = {"name": self.name, "partitions": self.partitions, "min_sync": self.min_sync,
                             "max_sync": self.max_sync, "max_async": self.max_async}
        if self.zones is not None:
            d["zones"] = list(self.zones)
        if self.initial_containers != 1:
            d["initial_containers"] = self.initial_containers
        d["maps"] = {m.name: {k: v for k, v in m.to_dict().items() if k != "name"} for m in self.maps}
        return d


def load_policy(path: str | Path) -> GridPolicy:
    """Read and check ``path`` (a ``grid.toml``)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise GridPolicyError(f"cannot read grid policy {path}: {e.strerror or e}", path=str(path)) from None
    except UnicodeDecodeError as e:
        raise GridPolicyError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})", path=str(path)) from None
    return parse_policy(text, source=str(path))


def parse_policy(text: str, source: str = "<string>") -> GridPolicy:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise GridPolicyError(f"{source}: not valid TOML: {e}", path=source) from None
    return policy_from_dict(data, source)


def policy_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> GridPolicy:
    """A policy from the file's shape (``to_dict``'s output reads back as the same policy)."""
    _check(data, source)
    zones = data.get("zones")
    return GridPolicy(name=data["name"], partitions=data["partitions"], min_sync=data.get("min_sync", 0),
                      max_sync=data.get("max_sync", 0), max_async=data.get("max_async", 0),
                      zones=None if zones is None else tuple(zones),
                      maps=tuple(_map(n, s) for n, s in data["maps"].items()), source=source,
                      initial_containers=data.get("initial_containers", 1))


def _map(name: str, settings: Mapping[str, Any]) -> MapPolicy:
    return MapPolicy(name, settings.get("loader"), tuple(sorted((k, v) for k, v in settings.items() if k != "loader")))


# -- the checks ----------------------------------------------------------------------------------------

def _fail(source: str, key: str, why: str) -> None:
    raise GridPolicyError(f"{source}: {key}: {why}", path=source, key=key)


def _int(data: Mapping[str, Any], key: str, source: str, *, default: int | None, lo: int, hi: int) -> int:
    if key not in data:
        if default is None:
            _fail(source, key, f"missing; it is required (an integer {lo}..{hi})")
        return default
    v = data[key]
    if type(v) is not int:  # bool is an int to Python, not to a policy
        _fail(source, key, f"must be an integer, got {type(v).__name__} {v!r}")
    if not lo <= v <= hi:
        _fail(source, key, f"must be {lo}..{hi}, got {v}" + (" (a count cannot be negative)" if v < 0 else ""))
    return v


def _check(data: Mapping[str, Any], source: str) -> None:
    if not isinstance(data, Mapping):
        _fail(source, "(top)", f"must be a table, got {type(data).__name__}")
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        _fail(source, unknown[0], f"unknown key (known: {', '.join(TOP_KEYS)})")
    name = data.get("name")
    if name is None:
        _fail(source, "name", "missing; the grid needs a name (containers of another grid are refused by it)")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        _fail(source, "name", f"must be a name of letters, digits, '_', '.', '-' (1..64, not starting with a "
                              f"digit), got {name!r}")
    _int(data, "partitions", source, default=None, lo=1, hi=MAX_PARTITIONS)
    min_sync = _int(data, "min_sync", source, default=0, lo=0, hi=MAX_REPLICAS)
    max_sync = _int(data, "max_sync", source, default=0, lo=0, hi=MAX_REPLICAS)
    _int(data, "max_async", source, default=0, lo=0, hi=MAX_REPLICAS)
    _int(data, "initial_containers", source, default=1, lo=1, hi=MAX_INITIAL_CONTAINERS)
    if min_sync > max_sync:
        _fail(source, "min_sync", f"min_sync = {min_sync} is more than max_sync = {max_sync}: no commit could "
                                  f"ever gather {min_sync} votes; raise max_sync or lower min_sync")
    zones = data.get("zones")
    if zones is not None:
        _check_zones(zones, min_sync, source)
    _check_maps(data.get("maps"), source)


def _check_zones(zones: Any, min_sync: int, source: str) -> None:
    if not isinstance(zones, (list, tuple)) or not zones:
        _fail(source, "zones", f"must be a non-empty list of zone names, got {zones!r}")
    for z in zones:
        if not isinstance(z, str) or not NAME_RE.fullmatch(z):
            _fail(source, "zones", f"zone {z!r} is not a name of letters, digits, '_', '.', '-'")
    if len(set(zones)) != len(zones):
        _fail(source, "zones", f"lists a zone twice: {list(zones)}")
    if len(zones) < 1 + min_sync:
        _fail(source, "zones", f"{len(zones)} zone(s) cannot hold a primary and min_sync = {min_sync} "
                               f"synchronous replicas of one partition, each in its own zone")


def _check_maps(maps: Any, source: str) -> None:
    if maps is None:
        _fail(source, "maps", "missing; add at least one map, e.g. [maps.accounts]")
    if not isinstance(maps, Mapping) or not maps:
        _fail(source, "maps", f"must be a table of at least one map ([maps.NAME]), got {maps!r}")
    for mname, settings in maps.items():
        key = f"maps.{mname}"
        if not NAME_RE.fullmatch(mname):
            _fail(source, key, f"map name {mname!r} is not a name of letters, digits, '_', '.', '-'")
        if not isinstance(settings, Mapping):
            _fail(source, key, f"must be a table ([{key}]), got {type(settings).__name__} {settings!r}")
        loader = settings.get("loader")
        if loader is not None and (not isinstance(loader, str) or (loader not in LOADER_KEYS and not re.fullmatch(
                r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", loader))):
            _fail(source, f"{key}.loader", f'must be "sqlite", "postgresql" or "module:Class", got {loader!r}')
        known = MAP_KEYS + (LOADER_KEYS.get(loader, ()) if loader else ())
        for k in settings:
            if k in RESERVED_MAP_KEYS:
                _fail(source, f"{key}.{k}", RESERVED_MAP_KEYS[k])
            if k not in known and not (loader and loader not in LOADER_KEYS):
                _fail(source, f"{key}.{k}", f"unknown key (known: {', '.join(known)})"
                      + ("" if loader else "; a loader's settings need loader = ..."))
        if loader in LOADER_REQUIRED and LOADER_REQUIRED[loader] not in settings:
            _fail(source, f"{key}.{LOADER_REQUIRED[loader]}", f"missing; the {loader} loader needs it")
        if "table" in settings and (not isinstance(settings["table"], str) or not re.fullmatch(r"[A-Za-z_]\w{0,62}",
                                                                                              settings["table"])):
            _fail(source, f"{key}.table", f"must be a table name of letters, digits and '_', got {settings['table']!r}")
    dbs = {_map(n, s).database() for n, s in maps.items() if isinstance(s, Mapping)} - {None}
    if len(dbs) > 1:
        _fail(source, "maps", "the maps' loaders name more than one database: a transaction over two maps would "
                              "need two-phase commit between them; give every map with a loader the same one")
