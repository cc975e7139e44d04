"""tessera.tools.timing (CPU): the interleaved rounds' order gives no call a fixed place, and
bad arguments are refused before anything is timed."""

from __future__ import annotations

import pytest

from tessera.tools.timing import cuda_time_ms, interleaved_ms, round_orders


def test_rounds_rotate_and_reverse():
    names = ["kernel", "a", "b"]
    rounds = list(round_orders(6, names))
    assert len(rounds) == 6
    assert all(sorted(r) == sorted(names) for r in rounds)
    firsts = [r[0] for r in rounds]
    assert all(firsts.count(c) == 2 for c in names)  # each call first equally often
    assert rounds[0] == names
    assert rounds[1] == (names[1:] + names[:1])[::-1]
    # no call always follows the same one
    followers = {n: {r[r.index(n) + 1] for r in rounds if r.index(n) + 1 < len(r)}
                 for n in names}
    assert all(len(f) == 2 for f in followers.values())


def test_one_call_is_its_own_round():
    assert list(round_orders(3, ["only"])) == [["only"]] * 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(rounds=0), "rounds"),
    (dict(reps=0), "reps"),
    (dict(settle_s=-1.0), "settle_s"),
])
def test_interleaved_ms_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        interleaved_ms({"a": lambda: None}, **kwargs)


def test_interleaved_ms_needs_a_call():
    with pytest.raises(ValueError, match="calls"):
        interleaved_ms({})
    with pytest.raises(ValueError, match="names"):
        list(round_orders(2, []))


def test_cuda_time_ms_rejects_an_empty_burst():
    with pytest.raises(ValueError, match="burst"):
        cuda_time_ms(lambda: None, burst=0)
