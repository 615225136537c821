"""The "< 2 / 3 >" switcher's numbers (sessions/templatetags/branches.py): a message's place
among its siblings, and nothing for a message without any."""

from __future__ import annotations

from sessions.templatetags.branches import branch_nav


def test_a_message_without_siblings_has_no_switcher() -> None:
    assert branch_nav({"seq": 4, "siblings": [4]}) is None
    assert branch_nav({"seq": 4}) is None


def test_the_middle_version_points_both_ways() -> None:
    assert branch_nav({"seq": 7, "siblings": [3, 7, 9]}) == {
        "index": 2,
        "count": 3,
        "prev": 3,
        "next": 9,
    }


def test_the_first_and_last_versions_have_one_neighbour() -> None:
    assert branch_nav({"seq": 3, "siblings": [3, 7]}) == {
        "index": 1,
        "count": 2,
        "prev": None,
        "next": 7,
    }
    assert branch_nav({"seq": 7, "siblings": [3, 7]}) == {
        "index": 2,
        "count": 2,
        "prev": 3,
        "next": None,
    }


def test_a_list_that_does_not_hold_the_message_shows_nothing() -> None:
    assert branch_nav({"seq": 5, "siblings": [3, 7]}) is None
