"""The padding plan of a pass under a row policy: pure, so every edge is checked without a model."""

from __future__ import annotations

import pytest

from specedge.runtime.engine.rows import ONE_ROW, PassPlan, RowPolicy, group_pad, plan_pass


def test_one_row_groups_never_pad() -> None:
    plan = plan_pass(start=10, width=3, group=1, capacity=64)
    assert plan == PassPlan(start=10, width=3, front=0, back=0, group=1)
    assert (plan.first, plan.size, plan.own) == (10, 3, slice(0, 3))
    assert plan.head_rows(all_logits=True) == 3 and plan.kept(all_logits=True) == slice(0, 3)
    assert plan.head_rows(all_logits=False) == 1 and plan.kept(all_logits=False) == slice(0, 1)


def test_a_pass_pads_after_its_tokens_where_the_context_has_room() -> None:
    plan = plan_pass(start=10, width=3, group=2, capacity=64)
    assert (plan.front, plan.back, plan.first, plan.size) == (0, 1, 10, 4)
    assert plan.kept(all_logits=True) == slice(0, 3)  # the own rows, not the copy of the last token
    # prefill: the head runs the last group [row 2, row 3]; the last own token's row is row 2, its first
    assert plan.head_rows(all_logits=False) == 2 and plan.kept(all_logits=False) == slice(0, 1)


def test_a_pass_at_the_end_of_the_context_pads_before_its_tokens() -> None:
    plan = plan_pass(start=62, width=1, group=2, capacity=63)
    assert (plan.front, plan.back, plan.first, plan.size) == (1, 0, 61, 2)
    assert plan.own == slice(1, 2) and plan.kept(all_logits=True) == slice(1, 2)
    assert plan.kept(all_logits=False) == slice(1, 2)  # the last of the group's rows


def test_whole_groups_and_groups_of_four() -> None:
    assert plan_pass(start=0, width=4, group=2, capacity=8).size == 4
    plan = plan_pass(start=5, width=5, group=4, capacity=64)
    assert (plan.front, plan.back, plan.size) == (0, 3, 8)
    assert plan.kept(all_logits=False) == slice(0, 1)  # rows 4..7 run the head; row 4 is the own last one


def test_a_pass_that_fits_neither_way_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        plan_pass(start=0, width=3, group=4, capacity=3)
    with pytest.raises(ValueError):
        plan_pass(start=0, width=0, group=2, capacity=8)


def test_verify_widths_are_the_whole_groups() -> None:
    widths = (1, 2, 3, 4, 5, 6, 8, 9, 13, 64)
    assert ONE_ROW.verify_widths(widths) == widths
    assert RowPolicy(group=2).verify_widths(widths) == (2, 4, 6, 8, 64)


def test_a_policy_is_a_value() -> None:
    with pytest.raises(AttributeError):
        ONE_ROW.group = 2  # type: ignore[misc]
    assert RowPolicy(group=2) == RowPolicy(group=2, exact=True) and hash(RowPolicy(group=2))


def test_group_pad_is_the_plans_pad() -> None:
    for group in (1, 2, 4):
        for width in range(1, 10):
            plan = plan_pass(start=20, width=width, group=group, capacity=64)
            assert group_pad(width, group) == plan.front + plan.back == plan.size - width
            assert plan.size % group == 0
