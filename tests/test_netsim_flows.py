"""The fluid model on its own: max-min fair shares, FIFO order, tolerance-based completion."""

from __future__ import annotations

import math

import pytest

import numpy as np

from exonet.netsim.flows import Flow, FluidNetwork, fifo, max_min


def flow(links: tuple[int, ...], size: float = 1.0, cap: float = math.inf) -> Flow:
    return Flow(0, 1, links, size, cap, 0.0, None)


def allocate(sharing, flows: list[Flow], capacity: list[float]) -> list[float]:
    """The rates ``sharing`` gives ``flows`` (rows of link ids padded with the infinite link)."""
    pad, width = len(capacity), max(len(f.links) for f in flows)
    links = np.array([f.links + (pad,) * (width - len(f.links)) for f in flows])
    return sharing(links, np.array([f.cap for f in flows]), np.array([*capacity, math.inf])).tolist()


@pytest.mark.parametrize("k", [1, 2, 3, 7, 64])
def test_k_flows_on_one_link_each_get_a_kth(k):
    assert allocate(max_min, [flow((0,)) for _ in range(k)], [10.0]) == [pytest.approx(10.0 / k, rel=1e-12)] * k


def test_max_min_gives_what_a_bottleneck_leaves_to_the_others():
    # link 0 (capacity 1) carries a and b; link 1 (capacity 2) carries a and c.
    rates = allocate(max_min, [flow((0, 1)), flow((0,)), flow((1,))], [1.0, 2.0])
    assert rates == pytest.approx([0.5, 0.5, 1.5], rel=1e-12)


def test_a_capped_flow_leaves_its_share_to_the_others():
    assert allocate(max_min, [flow((0,), cap=1.0), flow((0,))], [10.0]) == pytest.approx([1.0, 9.0], rel=1e-12)


def test_fifo_serves_the_oldest_message_on_each_link_first():
    assert allocate(fifo, [flow((0, 1)), flow((1, 2)), flow((3,))], [4.0, 2.0, 8.0, 5.0]) == [2.0, 0.0, 5.0]


@pytest.mark.parametrize("sharing, finishes", [("max-min", [2.0, 3.0]), ("fifo", [1.0, 3.0])])
def test_settle_finishes_flows_at_exact_times(sharing, finishes):
    net = FluidNetwork([1.0], sharing)
    for size in (1.0, 2.0):
        net.add(flow((0,), size))
    done = net.settle()
    assert [t for _, t in done] == pytest.approx(finishes, rel=1e-12)
    assert len(net) == 0


def test_settle_until_leaves_remaining_bytes():
    net = FluidNetwork([1.0])
    net.add(flow((0,), 3.0))
    assert net.settle(until=1.0) == []
    assert [f.remaining for f in net.flows] == [pytest.approx(2.0)] and net.now == 1.0


def test_near_simultaneous_finishes_complete_together_without_livelock():
    net = FluidNetwork([3.0])
    sizes = [1.0, 1.0 + 1e-15, 1.0 - 1e-15]
    for s in sizes:
        net.add(flow((0,), s))
    done = net.settle()
    assert len(done) == 3 and len({t for _, t in done}) == 1


def test_paused_endpoint_stops_its_flow():
    net = FluidNetwork([1.0, 1.0])
    net.add(Flow(0, 1, (0, 1), 1.0, math.inf, 0.0, None))
    net.pause(1, True)
    net.update()
    assert net.flows[0].rate == 0.0 and net.next_finish() == math.inf
    net.pause(1, False)
    net.update()
    assert net.flows[0].rate == 1.0
