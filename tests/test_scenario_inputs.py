"""Numbers that would make a rate, a time or a tick non-finite: each is refused at the door, by key and line,
and the smallest values accepted still replay to a finite time."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from exonet import Scenario, ScenarioError, Trace, simulate

NET = '[network]\nbandwidth = "1 Gbit/s"\n'


# Values that passed the schema and then made a rate, a time or a tick count infinite inside simulate (an
# OverflowError), or made the model loop: each is refused at the door, naming the key and its line.
NON_FINITE = [
    ("network.latency", NET + 'latency = "1e300 h"\n', "too long to be a time"),
    ("network.setup", NET + 'setup = "1e300 h"\n', "too long to be a time"),
    ("network.efficiency", NET + "efficiency = 1.1e-308\n", "[0.001, 1]"),  # found by the fuzz test
    ("network.efficiency", NET + "efficiency = 1e-300\n", "[0.001, 1]"),
    ("network.host_cores", NET + 'message_overhead = "1 ms"\nhost_cores = 1e-300\n', "[0.001, 1e+06]"),
    ("compute.tflops", NET + '[compute]\nmode = "flops"\ntflops = 1e-300\n', "[1e-09, 1e+09]"),
    ("network.nccl.channels", NET + 'backend = "nccl"\n[network.nccl]\nchannels = 1000000000\n', "[1, 64]"),
    ("network.nccl.buffsize", NET + 'backend = "nccl"\n[network.nccl]\nbuffsize = "1 B"\n', "at least 4 KiB"),
    ("failures.mtbf", NET + '[failures]\nmtbf = "1e300 h"\n', "too long to be a time"),
    ("failures.repair", NET + '[failures]\nmtbf = "1 h"\nrepair = "1e300 h"\n', "too long to be a time"),
    ("failures.restart", NET + '[failures]\nmtbf = "1 h"\nrestart = "1e300 h"\n', "too long to be a time"),
    # found by a review of issue 39's inputs: a queue or window that holds nothing made a rate vanish in simulate
    # (OverflowError, ZeroDivisionError, or max() of nothing), under every backend
    ("network.queue", NET + 'latency = "10 ms"\nqueue = "1e-300 s"\n', "holds nothing"),
    ("network.queue", NET + 'latency = "10 ms"\nqueue = "1e-300 B"\n', "holds nothing"),
    ("network.queue", NET + 'latency = "10 ms"\nqueue = "5e-324 B"\n', "holds nothing"),
    ("network.tcp_window", NET + 'latency = "10 ms"\ntcp_window = "5e-324 B"\n', "less than one byte"),
    ("network.tcp_window", NET + 'latency = "10 ms"\nbackend = "nccl"\ntcp_window = "1e-300 B"\n',
     "less than one byte"),
]


@pytest.mark.parametrize(("key", "body", "expected"), NON_FINITE,
                         ids=[f"{c[0]}={c[1].split()[-1]}" for c in NON_FINITE])
def test_a_value_that_would_make_the_model_non_finite_is_refused_by_key_and_line(tmp_path: Path, key: str, body: str,
                                                                                  expected: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text('name = "x"\n' + body)
    with pytest.raises(ScenarioError) as info:
        Scenario.load(path)
    assert re.match(rf"{re.escape(str(path))}:\d+: {re.escape(key)}: ", str(info.value)), str(info.value)
    assert expected in str(info.value)


def test_a_tiny_efficiency_is_a_scenario_error_not_an_overflow_in_simulate() -> None:
    trace = Trace(num_nodes=2)
    for rank in range(2):
        trace.add_compute(rank, 0.1)
        trace.add_collective(rank, "all_reduce", 1000)
        trace.add_step(rank)
    with pytest.raises(ScenarioError, match=r"network.efficiency: 1.1e-308 is out of range"):
        simulate(trace, {"name": "x", "network": {"bandwidth": "1 Gbit/s", "efficiency": 1.1e-308}})


@pytest.mark.parametrize("backend", [None, "nccl", "gloo"])
def test_the_smallest_queue_and_window_replay_to_a_finite_time(backend: str | None) -> None:
    trace = Trace(num_nodes=2)
    for rank in range(2):
        trace.add_collective(rank, "all_reduce", 2**20)
        trace.add_step(rank)
    net = {"bandwidth": "1 Gbit/s", "latency": "10 ms", **({"backend": backend} if backend else {})}
    free = simulate(trace, {"name": "x", "network": net}).wall_clock_s
    for least in ({"queue": "1 us"}, {"queue": "1 B"}, {"tcp_window": "1 B"}):
        slow = simulate(trace, {"name": "x", "network": {**net, **least}}).wall_clock_s
        assert math.isfinite(slow) and slow > free, (least, slow, free)


def test_a_payload_past_one_pebibyte_is_refused_when_traced() -> None:
    with pytest.raises(ValueError, match=r"nbytes must be at most 2\*\*50"):
        Trace(num_nodes=2).add_collective(0, "all_reduce", 2**63 - 1)
