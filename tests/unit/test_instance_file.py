"""The replication instance file: round trip, damage detection, history records, and odd states (a
directory, a truncated file), each a clear error naming the file, never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import multisite
from multisite import InstanceFileCorrupt, NotAnInstance
from multisite.cli.main import cli
from multisite.instance import instance_file as ifile
from multisite.instance.layout import Layout


def _sample() -> ifile.InstanceFile:
    inst = ifile.InstanceFile(name="A", group="bank", supplementary=True, role="secondary", created=1.5,
                              seqno=77, durability="group", segment_bytes=8192)
    inst.add_history(1, "A", "originating")
    inst.add_history(50, "B", "replicating", upstream="B")
    s = inst.slot("B")
    s.last_sent, s.last_confirmed = 70, 60
    inst.slot("spark", kind="consumer").last_confirmed = 10
    inst.streams[1] = ifile.StreamInfo(stream=1, source_group="other", root_primary="P", last_stream_seqno=9)
    inst.receiving_from = "B"
    return inst


def test_dumps_loads_round_trip():
    inst = _sample()
    back = ifile.loads(ifile.dumps(inst))
    assert back == inst
    assert back.to_dict()["slots"]["B"]["last_confirmed"] == 60


def test_save_load_round_trip(tmp_path):
    p = tmp_path / "instance.msi"
    inst = _sample()
    ifile.save(p, inst)
    assert ifile.load(p) == inst
    assert [x.name for x in tmp_path.iterdir()] == ["instance.msi"]  # no temp file left behind


@pytest.mark.parametrize("damage", ["magic", "crc", "body", "truncated", "empty", "short"])
def test_damage_is_detected(damage):
    data = bytearray(ifile.dumps(_sample()))
    if damage == "magic":
        data[0] ^= 0x20
    elif damage == "crc":
        data[5] ^= 0x01
    elif damage == "body":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncated":
        del data[-3:]
    elif damage == "empty":
        data = bytearray()
    else:
        data = data[:6]
    with pytest.raises(InstanceFileCorrupt) as ei:
        ifile.loads(bytes(data), "X/instance.msi")
    assert "X/instance.msi" in str(ei.value)


def test_a_valid_checksum_over_garbage_is_still_rejected():
    import struct
    import zlib

    body = b"\x93\x01\x02\x03"  # msgpack, but not an instance file
    data = ifile.MAGIC + struct.pack("<I", zlib.crc32(body)) + body
    with pytest.raises(InstanceFileCorrupt):
        ifile.loads(data)


def test_missing_file_is_not_an_instance(tmp_path):
    with pytest.raises(NotAnInstance):
        ifile.load(tmp_path / "instance.msi")


def test_history_add_replaces_a_record_starting_at_the_same_or_later_seqno():
    inst = ifile.InstanceFile(name="A", group="g")
    inst.add_history(1, "A", "originating")
    inst.add_history(10, "B", "replicating", upstream="B")
    inst.add_history(10, "C", "replicating", upstream="C")  # nothing happened in between: replaces
    assert [(h.start_seqno, h.root_primary) for h in inst.history] == [(1, "A"), (10, "C")]
    inst.add_history(5, "A", "originating")  # starts before the last: the later one goes
    assert [(h.start_seqno, h.root_primary) for h in inst.history] == [(1, "A"), (5, "A")]


def test_history_at_and_truncate():
    inst = ifile.InstanceFile(name="A", group="g")
    for start, root in [(1, "A"), (100, "B"), (200, "A")]:
        inst.add_history(start, root, "originating" if root == "A" else "replicating")
    assert inst.history_at(0) is None
    assert [inst.history_at(s).root_primary for s in (1, 99, 100, 199, 200, 10**9)] == list("AABBAA")
    inst.truncate_history(200)  # seqno 200 stays: so does the record of its range
    assert [h.start_seqno for h in inst.history] == [1, 100, 200]
    inst.truncate_history(199)  # rollback to 199: the range starting at 200 is gone
    assert [h.start_seqno for h in inst.history] == [1, 100]
    inst.truncate_history(150)  # 150 is inside the range starting at 100: it stays
    assert [h.start_seqno for h in inst.history] == [1, 100]
    inst.truncate_history(0)  # the first record always stays
    assert [h.start_seqno for h in inst.history] == [1]
    assert inst.current_history().root_primary == "A"


def test_create_writes_an_instance_file_and_close_records_the_seqno(tmp_path):
    root = multisite.create(tmp_path / "A", name="A", group="bank", supplementary=True)
    info = ifile.load(Layout(root).instance_file)
    assert (info.name, info.group, info.supplementary, info.role) == ("A", "bank", True, "primary")
    assert [(h.start_seqno, h.root_primary, h.role) for h in info.history] == [(1, "A", "originating")]
    with multisite.open(root) as db:
        db.create_region("r")
        db.set("r", ("k",), 1)
        db.set("r", ("k",), 2)
    assert ifile.load(Layout(root).instance_file).seqno == 2


def test_open_refuses_a_damaged_instance_file(tmp_path):
    root = multisite.create(tmp_path / "A", name="A")
    p = Layout(root).instance_file
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x01
    p.write_bytes(data)
    with pytest.raises(InstanceFileCorrupt) as ei:
        multisite.open(root)
    assert str(p) in str(ei.value)
    with pytest.raises(InstanceFileCorrupt):  # the lock was released: the error is the same again
        multisite.open(root)


def test_an_instance_file_that_is_a_directory_is_a_clear_error(inst):
    # It raised IsADirectoryError (a traceback from the CLI).
    (inst / "instance.msi").unlink()
    (inst / "instance.msi").mkdir()
    with pytest.raises(InstanceFileCorrupt, match="instance.msi is a directory"):
        multisite.open(inst)
    res = CliRunner().invoke(cli, ["instance", "show", str(inst)])
    assert res.exit_code == 1 and "INSTANCE_FILE_CORRUPT" in res.output and "instance.msi" in res.output


@pytest.mark.parametrize("cut", [0, 3, 7, 8, 20, -1])
def test_a_truncated_instance_file_names_the_file(inst, cut):
    data = (inst / "instance.msi").read_bytes()
    (inst / "instance.msi").write_bytes(data[:cut] if cut >= 0 else data[:-1])
    with pytest.raises(InstanceFileCorrupt, match=str(inst / "instance.msi")):
        multisite.open(inst)
