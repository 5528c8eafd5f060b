"""The fluid model on its own: max-min fair shares, FIFO order, tolerance-based completion, batches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exonet.netsim.flows import Batch, FluidNetwork, Shape, Solo, fifo, max_min


def batch(paths: list[tuple[int, ...]], links: int, sizes: list[float] | None = None, caps: list[float] | None = None,
          src: int = 0, dst: int = 1, latencies: list[float] | None = None) -> Batch:
    """Messages on ``paths`` of a network with ``links`` links, entering together."""
    k = len(paths)
    shape = Shape(paths, [src] * k, [dst] * k, caps or [math.inf] * k, latencies or [0.0] * k, pad=links)
    return Batch(shape, np.array(sizes or [1.0] * k, dtype=float), None)


def message(links: tuple[int, ...], size: float = 1.0, on: int = 1) -> Batch:
    return batch([links], on, [size])


def allocate(sharing, paths: list[tuple[int, ...]], capacity: list[float],
             caps: list[float] | None = None) -> list[float]:
    """The rates ``sharing`` gives flows on ``paths`` (rows of link ids padded with the infinite link)."""
    shape = batch(paths, len(capacity), caps=caps).shape
    return sharing(shape.links, shape.cap, np.array([*capacity, math.inf])).tolist()


@pytest.mark.parametrize("k", [1, 2, 3, 7, 64])
def test_k_flows_on_one_link_each_get_a_kth(k):
    assert allocate(max_min, [(0,)] * k, [10.0]) == [pytest.approx(10.0 / k, rel=1e-12)] * k


def test_max_min_gives_what_a_bottleneck_leaves_to_the_others():
    # link 0 (capacity 1) carries a and b; link 1 (capacity 2) carries a and c.
    assert allocate(max_min, [(0, 1), (0,), (1,)], [1.0, 2.0]) == pytest.approx([0.5, 0.5, 1.5], rel=1e-12)


def test_a_capped_flow_leaves_its_share_to_the_others():
    assert allocate(max_min, [(0,), (0,)], [10.0], caps=[1.0, math.inf]) == pytest.approx([1.0, 9.0], rel=1e-12)


def test_fifo_serves_the_oldest_message_on_each_link_first():
    assert allocate(fifo, [(0, 1), (1, 2), (3,)], [4.0, 2.0, 8.0, 5.0]) == [2.0, 0.0, 5.0]


@pytest.mark.parametrize("sharing, finishes", [("max-min", [2.0, 3.0]), ("fifo", [1.0, 3.0])])
def test_run_finishes_flows_at_exact_times(sharing, finishes):
    net = FluidNetwork([1.0], sharing)
    for size in (1.0, 2.0):
        net.add(message((0,), size))
    done = net.run()
    assert [t for _, _, t in done] == pytest.approx(finishes, rel=1e-12)
    assert len(net) == 0


def test_run_until_leaves_remaining_bytes():
    net = FluidNetwork([1.0])
    b = message((0,), 3.0)
    net.add(b)
    assert net.run(until=1.0) == []
    assert b.remaining.tolist() == [pytest.approx(2.0)] and net.now == 1.0


def test_near_simultaneous_finishes_complete_together_without_livelock():
    net = FluidNetwork([3.0])
    net.add(batch([(0,)] * 3, 1, [1.0, 1.0 + 1e-15, 1.0 - 1e-15]))
    done = net.run()
    assert len(done) == 1 and done[0][1].tolist() == [0, 1, 2]


def test_paused_endpoint_stops_its_flow():
    net = FluidNetwork([1.0, 1.0])
    b = message((0, 1), on=2)
    net.add(b)
    net.pause(1, True)
    net.update()
    assert b.rate[0] == 0.0 and net.next_finish() == math.inf
    net.pause(1, False)
    net.update()
    assert b.rate[0] == 1.0


def test_rows_of_one_batch_finish_apart_and_deliver_by_latency():
    # two messages share link 0 (capacity 2); the short one ends at 1 s, the long one then runs alone.
    net = FluidNetwork([2.0, 2.0])
    b = batch([(0,), (0, 1)], 2, sizes=[1.0, 3.0], latencies=[0.5, 0.25])
    net.add(b)
    done = net.run()
    assert [(rows.tolist(), t) for _, rows, t in done] == [([0], pytest.approx(1.0)), ([1], pytest.approx(2.0))]
    assert b.arrivals(np.array([0, 1])) == [(0.25, 1), (0.5, 1)]
    assert not net.batches and net.busy() == frozenset()


def test_a_seen_combination_of_batches_reuses_its_allocation():
    capacity = [1.0, 3.0]
    first, again = FluidNetwork(capacity), FluidNetwork(capacity)
    shape = batch([(0, 1), (1,)], 2).shape
    for net in (first, again):
        net.add(Batch(shape, np.array([1.0, 1.0]), None))
        net.update()
    (a,), (b,) = first.batches, again.batches
    assert a.rate is b.rate and a.rate.tolist() == pytest.approx([1.0, 2.0], rel=1e-12)


@pytest.mark.parametrize("sharing", ["max-min", "fifo"])
def test_a_recorded_solo_run_answers_as_running_up_to_then(sharing):
    capacity = [1.0, 2.0, 3.0]
    paths = [(0, 1), (0,), (1, 2), (2,)]
    shape = batch(paths, 3).shape
    sizes = np.array([1.0, 2.5, 0.5, 4.0])
    solo = Solo(capacity, sharing, shape, sizes)
    for until in (0.0, 0.3, 1.0, 2.0, 2.75, 10.0, math.inf):
        net = FluidNetwork(capacity, sharing)
        b = Batch(shape, sizes, "tag")
        net.add(b)
        ran = net.run(until)
        done, rest = solo.state(until, "tag")
        assert [(rows.tolist(), t) for _, rows, t in done] == [(rows.tolist(), t) for _, rows, t in ran]
        assert [r.remaining.tolist() for r in rest] == [b.remaining.tolist() for b in net.batches]
        assert all(r.tag == "tag" for r in rest)

