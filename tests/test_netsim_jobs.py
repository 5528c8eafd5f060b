"""Several jobs on one network: placement, each job's own result, shared links against max-min."""

from __future__ import annotations

import pytest

from exonet import Scenario, Trace
from exonet.netsim import simulate

exact = {"rel": 1e-12, "abs": 1e-15}
BL, AL = 1e9 / 8, 20e-3


def two_regions() -> Scenario:
    return Scenario.from_dict({
        "name": "bottleneck",
        "network": {"bandwidth": "100 Gbit/s"},
        "regions": [{"name": "us", "share": 0.5}, {"name": "eu", "share": 0.5}],
        "links": [{"between": ["us", "eu"], "bandwidth": "1 Gbit/s", "latency": "20 ms"}],
    })


def job(n: int, op: str, nbytes: int, steps: int = 1, compute: float = 0.0) -> Trace:
    t = Trace(n)
    for r in range(n):
        for _ in range(steps):
            t.add_compute(r, compute)
            t.add_collective(r, op, nbytes)
            t.add_step(r)
    return t


def test_two_jobs_on_one_bottleneck_share_it_max_min():
    sa, sb = 10_000_000, 30_000_000
    result = simulate([job(2, "all_gather", sa), job(2, "all_gather", sb)], two_regions(), placement=[[0, 2], [1, 3]])
    # each direction of the link holds one flow of each job: B/2 each until A's is done, then B alone
    a, b = AL + 2 * sa / BL, AL + (sa + sb) / BL
    assert [j.wall_clock_s for j in result.jobs] == pytest.approx([a, b], **exact)
    assert result.wall_clock_s == pytest.approx(b, **exact)
    assert [s for j in result.jobs for s in j.step_end_times] == pytest.approx([a, b], **exact)
    assert [j.wire_bytes for j in result.jobs] == [[sa, sa], [sb, sb]]
    link = {load.name: load for load in result.links}
    for direction in ("us->eu", "eu->us"):
        assert link[direction].by_job == (sa, sb)
        assert link[direction].utilization == pytest.approx((sa + sb) / (BL * b), **exact)
    assert link["uplink 0"].by_job == (sa, 0.0) and link["uplink 1"].by_job == (0.0, sb)


def test_jobs_that_share_no_link_take_their_own_time():
    hosts = Scenario.from_dict({
        "name": "hosts", "network": {"bandwidth": "100 Gbit/s", "latency": "10 us"},
        "hosts": {"devices": 4, "bandwidth": "2400 Gbit/s", "latency": "1 us"},
    })
    a, b = job(4, "all_reduce", 8_000_000, steps=3, compute=0.01), job(8, "all_reduce", 2_000_000, steps=2)
    result = simulate([a, b], hosts, placement=[{"hosts": [2]}, {"hosts": [0, 1]}])
    assert result.jobs[0].wall_clock_s == simulate(a, hosts).wall_clock_s
    assert result.jobs[1].wall_clock_s == simulate(b, hosts).wall_clock_s
    assert result.jobs[0].step_end_times == simulate(a, hosts).step_end_times
    assert len(result.per_node) == 12 and result.jobs[0].per_node[0].compute_s == pytest.approx(0.03, **exact)


def test_the_default_placement_is_consecutive_blocks():
    a, b = job(2, "all_reduce", 4_000_000), job(2, "all_reduce", 6_000_000)
    default = simulate([a, b], two_regions())
    explicit = simulate([a, b], two_regions(), placement=[[0, 1], [2, 3]])
    assert [j.wall_clock_s for j in default.jobs] == [j.wall_clock_s for j in explicit.jobs]
    assert simulate([a], two_regions().resolve(2)).jobs[0].wall_clock_s == simulate(a, two_regions()).wall_clock_s


@pytest.mark.parametrize("placement,message", [
    ([[0, 1], [1, 2]], r"placement\[1\] and placement\[0\] both hold rank 1"),
    ([[0, 1]], r"placement has 1 entries for 2 traces"),
    ([[0, 1], [2]], r"placement\[1\] gives 1 ranks but trace 1 has 2 ranks"),
    ([[0, 1], [2, -3]], r"placement\[1\] must hold non-negative integer ranks"),
    ([[0, 1], {"host": [1]}], r"placement\[1\] must be a list of ranks or \{'hosts'"),
    ([[0, 1], {"hosts": ["a"]}], r"placement\[1\] must be a list of ranks or \{'hosts': \[host indices\]\}"),
])
def test_bad_placements_are_named(placement, message):
    with pytest.raises(ValueError, match=message):
        simulate([job(2, "all_reduce", 1000), job(2, "all_reduce", 1000)], two_regions(), placement=placement)


def test_each_job_gets_its_own_history_and_a_resolved_scenario_may_be_larger():
    a, b = job(2, "all_reduce", 4_000_000, steps=2), job(2, "all_reduce", 6_000_000, steps=1)
    result = simulate([a, b], two_regions().resolve(6), history=[[3.0, 2.0], None], placement=[[0, 3], [1, 2]])
    assert len(result.per_node) == 6 and result.jobs[1].history is None
    assert [loss for _, loss in result.jobs[0].loss_vs_time()] == [3.0, 2.0]
    assert result.jobs[0].step_end_times == simulate(a, two_regions().resolve(2)).step_end_times
    with pytest.raises(ValueError, match="history has 1 entries for 2 jobs"):
        simulate([a, b], two_regions(), history=[[1.0, 2.0]])


def test_placement_needs_several_traces():
    with pytest.raises(ValueError, match="placement= places several jobs"):
        simulate(job(2, "all_reduce", 1000), two_regions(), placement=[[0, 1]])
