"""``Kept``, the bounded cache behind the scheduler's kept requests, indexes and judges."""

from __future__ import annotations

from docker_variant.planner.kept import Kept


def test_the_least_recently_used_goes_first_and_is_reported() -> None:
    dropped: list[str] = []
    kept: Kept[int, str] = Kept(2, dropped.append)
    kept.put(1, "one")
    kept.put(2, "two")
    assert kept.get(1) == "one"  # 1 is now the most recently used
    kept.put(3, "three")
    assert (kept.get(2), kept.get(1), kept.get(3)) == (None, "one", "three")
    assert dropped == ["two"]


def test_a_value_replaced_under_its_key_is_dropped_once() -> None:
    dropped: list[str] = []
    kept: Kept[int, str] = Kept(4, dropped.append)
    first = "first"
    kept.put(1, first)
    kept.put(1, first)  # the same value again: nothing dropped
    assert kept.put(1, "second") == "second"
    assert kept.get(1) == "second" and dropped == ["first"]
