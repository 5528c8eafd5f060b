"""How a strategy names a subgroup: every member once, every member a rank; the whole world is None."""

from __future__ import annotations

import pytest
import torch

from exonet.communicator import Communicator


def comm(rank: int = 0, k: int = 4) -> Communicator:
    return Communicator(rank, k, torch.device("cpu"))


@pytest.mark.parametrize(("group", "k", "match"), [
    ([0, 1, 2, 9], 4, r"group \[0, 1, 2, 9\]: rank 9 is not a rank in \[0, 4\)"),  # as long as the world: not it
    ([0, 5], 2, r"rank 5 is not a rank in \[0, 2\)"),
    ([-1, 0], 4, r"rank -1 is not a rank"),
    ([0, 0], 2, r"group \[0, 0\]: rank 0 is named twice"),  # would pass for the world and halve no mean
    ([1, 0, 1, 2], 4, r"rank 1 is named twice"),
])
def test_a_group_with_a_rank_out_of_range_or_twice_is_an_error(group, k, match):
    c = comm(0, k)
    for call in (c.group_of, c.group_size, c._members, lambda g: c.declare_groups([g])):
        with pytest.raises(ValueError, match=match):
            call(group)


def test_the_world_in_any_order_is_the_default_group():
    c = comm(2, 4)
    assert c.group_of([3, 1, 0, 2]) is None and c._members((3, 2, 1, 0)) is None
    assert c.group_size([3, 1, 0, 2]) == 4 and c.group_size(None) == 4 and c.group_size([2, 0]) == 2
    with pytest.raises(ValueError, match=r"group \(0, 2\) was never declared"):
        c.group_of([2, 0])
    with pytest.raises(ValueError, match="rank 2 is not a member of group"):
        c.group_of([0, 1])
