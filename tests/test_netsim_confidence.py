"""The expected range: a replay widened by the model's own errors, measured on the testbed, in its regime."""

from __future__ import annotations

import json

import pytest

from exonet import Scenario, Trace, simulate
from exonet.netsim import confidence
from exonet.validate.residuals import BANDS, REGIMES, bands


def test_the_shipped_bands_are_what_the_recorded_cases_give_today() -> None:
    """bands.json is generated (python -m exonet.validate --bands): a model change that moves a residual fails
    here until the file is written again, so the range never rests on an older model's errors."""
    shipped = json.loads(BANDS.read_text())["regimes"]
    assert shipped == bands()
    assert set(shipped) == set(REGIMES) and all(b["cases"] >= 15 for b in shipped.values())


def ring(n: int = 4, nbytes: int = 64_000_000, compute: float = 1.0, steps: int = 3) -> Trace:
    t = Trace(num_nodes=n)
    for rank in range(n):
        for _ in range(steps):
            t.add_compute(rank, compute)
            t.add_collective(rank, "all_reduce", nbytes)
            t.add_step(rank)
    return t


@pytest.mark.parametrize("network, nbytes, regime", [
    ({"backend": "gloo", "latency": "10 ms"}, 64_000_000, "library"),
    ({"backend": "nccl", "latency": "10 ms"}, 64_000_000, "library"),
    ({"backend": "gloo", "latency": "10 ms"}, 100_000, "library-calls"),  # 8 ms of bytes, ~100 ms of latency
    ({"backend": "nccl", "latency": "10 ms"}, 100_000, "library-calls"),
    ({"latency": "10 ms"}, 64_000_000, "phase"),
    ({"latency": "10 ms"}, 100_000, "phase"),  # the phase model's own band covers its small calls
    ({"latency": "10 ms", "queue": "5 ms", "tcp_window": "4 MiB"}, 64_000_000, "lossy"),
    ({"latency": "10 ms", "queue": "5 ms", "tcp_window": "4 MiB", "streams": 16}, 64_000_000, "lossy-streams"),
])
def test_the_range_scales_the_communication_by_its_regimes_band(network: dict, nbytes: int, regime: str) -> None:
    scenario = Scenario.from_dict({"name": "r", "network": {"bandwidth": "100 Mbit/s", **network}})
    result = simulate(ring(nbytes=nbytes), scenario)
    p10, p90 = confidence.band(regime)
    comm = result.wall_clock_s - max(node.compute_s for node in result.per_node)
    low, high = result.wall_clock_range
    assert result.regime == regime
    assert result.expected_range == pytest.approx((low - max(0, 1 - p10) * comm, high + max(0, p90 - 1) * comm),
                                                  rel=1e-12)
    assert result.expected_range[0] <= low <= result.wall_clock_s <= high <= result.expected_range[1]
    assert f"in the {regime} regime" in result.summary()


def test_pure_compute_has_no_width_and_many_streams_in_a_lossy_queue_the_widest() -> None:
    compute = simulate(ring(nbytes=0), {"name": "c", "network": {"bandwidth": "1 Gbit/s"}})
    assert compute.expected_range == (compute.wall_clock_s, compute.wall_clock_s)
    assert confidence.band("library")[1] < confidence.band("phase")[1] < confidence.band("lossy-streams")[1]


def test_wire_bytes_by_level_put_the_wide_area_first() -> None:
    """Two regions, one node each: a ring all-reduce of S sends S from each NIC, all of it across the link."""
    S = 8_000_000
    two = {"name": "two", "network": {"bandwidth": "1 Gbit/s"}, "regions": [{"name": "a", "ranks": [0]},
           {"name": "b", "ranks": [1]}], "links": [{"between": ["a", "b"], "bandwidth": "1 Gbit/s"}]}
    result = simulate(ring(n=2, nbytes=S, steps=1), two)
    assert result.wire_by_level() == {"inter_region": S, "nic": S, "in_host": 0.0}
    assert list(result.wire_by_level()) == ["inter_region", "nic", "in_host"]
    assert "wire bytes per trainer: inter-region 8.000 MB, nic 8.000 MB, in-host 0.000 MB" in result.summary()
