"""History records take their uid and time from the caller when given (a simulation replays a seed),
and draw fresh ones otherwise."""

from multisite.instance.instance_file import InstanceFile


def test_add_history_uses_the_uid_and_time_given():
    info = InstanceFile(name="A", group="g")
    rec = info.add_history(1, "A", "originating", uid=12345, created=7.5)
    assert (rec.uid, rec.created) == (12345, 7.5)


def test_add_history_draws_a_uid_and_reads_the_clock_by_default():
    info = InstanceFile(name="A", group="g")
    a = info.add_history(1, "A", "originating")
    b = info.add_history(5, "A", "originating")
    assert a.uid != b.uid and a.created > 0


def test_cut_at_passes_the_uid_to_a_primary_s_new_record():
    info = InstanceFile(name="A", group="g", role="primary")
    info.add_history(1, "A", "originating", uid=1, created=0.0)
    info.cut_at(0, uid=99, created=1.0)
    assert [h.uid for h in info.history] == [99]
