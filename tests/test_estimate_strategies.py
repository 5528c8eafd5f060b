"""estimate for every strategy: the issue's repro commands (small --steps), exact payloads, the online clock for
strategies that react to simulated time, solving for an inter-region link, and what Trace.scaled keeps."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import pytest

from exonet.cli import main
from exonet.errors import ScenarioError
from exonet.estimate import LayerStack, estimate, simulate_estimate
from exonet.estimate.solver import bandwidth_for_utilization, utilization_at
from exonet.strategies.sparta import SparseAverager
from exonet.trace import Trace

TWO_REGIONS = {"name": "two-regions", "network": {"bandwidth": "100 Gbit/s", "latency": "1 ms"},
               "regions": [{"name": "us", "share": 0.5}, {"name": "eu", "share": 0.5}],
               "links": [{"between": ["us", "eu"], "bandwidth": "1 Gbit/s", "latency": "40 ms"}]}
SLOW_LAST = {"name": "slow-last", "network": {"bandwidth": "10 Gbit/s"}, "nodes": [{"ranks": [3], "speed": 0.25}]}


def cli_json(capsys, *args: str) -> dict:
    assert main(["estimate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def repro(strategy: str, steps: int = 100) -> list[str]:
    """The issue's command: a 1B model on 8 nodes, bf16, one second of compute per step."""
    return ["--model-params", "1e9", "--strategy", strategy, "--nodes", "8", "--steps", str(steps),
            "--scenario", "datacenter", "--step-time", "1", "--dtype", "bf16"]


def test_streaming_diloco_honours_dtype_and_sends_what_diloco_sends(capsys):
    streaming = cli_json(capsys, *repro("streaming_diloco:H=50"))
    diloco = cli_json(capsys, *repro("diloco:H=50"))
    assert streaming["payload_bytes_per_node"] == diloco["payload_bytes_per_node"] == 2 * 2 * streaming["params"]


def test_demo_payload_at_1b_is_one_32nd_byte_per_parameter_per_step(capsys):
    """Every width of the stack is a multiple of 64: 64 × 64 blocks, 32 kept, int16 index + bf16 value each."""
    report = cli_json(capsys, *repro("demo", steps=3))
    stack = LayerStack(10**9, 24, None)
    assert all(p.shape[0] % 64 == 0 and p.shape[1] % 64 == 0 for p in stack.parameters())
    assert report["params"] % 32 == 0 and report["payload_bytes_per_node"] == 3 * report["params"] // 32


@pytest.mark.parametrize("strategy", ["async_diloco:H=5", "fedbuff:H=5", "async_diloco:H=5,dynamic_local_updates=True"])
def test_server_strategies_are_estimated_on_the_online_clock(capsys, strategy):
    report = cli_json(capsys, "--model-params", "1e6", "--strategy", strategy, "--nodes", "8", "--steps", "20",
                      "--scenario", "datacenter", "--step-time", "1")
    assert report["payload_bytes_per_node"] == (20 // 5) * 4 * report["params"]  # one Δ of 4P per round
    assert 20 <= report["wall_clock_s"] < 21


def test_deadline_rounds_are_estimated_on_the_online_clock():
    e = estimate("diloco:H=5,deadline_s=6", params=1e6, num_nodes=4, max_steps=20, step_time=1.0, scenario=SLOW_LAST)
    p = e.params
    # rank 3 (a quarter of the speed) misses every deadline: it sends nothing and adopts what rank 0 sends it,
    # θ_global and the outer momentum (2P) after each of the 4 rounds' averages (P) of ranks 0-2.
    assert [e.trace.payload_bytes(r) for r in range(4)] == [4 * 4 * (p + 2 * p), 4 * 4 * p, 4 * 4 * p, 0]
    assert simulate_estimate(e, SLOW_LAST).wall_clock_s == pytest.approx(80)
    with pytest.raises(ValueError, match="give the scenario"):
        estimate("fedbuff", params=1e6, num_nodes=4, max_steps=20, step_time=1.0)


def test_replica_groups_are_estimated_with_exact_bytes():
    e = estimate("diloco:H=5,replica_size=2", params=1e6, num_nodes=4, max_steps=10, step_time=1.0, dtype="bf16")
    p = e.params
    assert all(e.trace.payload_bytes(r) == 10 * 2 * p + 2 * 2 * 2 * math.ceil(p / 2) for r in range(4))
    e.trace.validate()
    with pytest.raises(ValueError, match="replica_size=3 must divide"):
        estimate("diloco:replica_size=3", params=1e6, num_nodes=4, max_steps=1, step_time=1.0)


def test_sparta_and_sparta_diloco_at_1b_take_under_30_s():
    code = (
        "import time\n"
        "from exonet.estimate import estimate, simulate_estimate\n"
        "for s in ('sparta', 'sparta_diloco'):\n"
        "    t = time.perf_counter()\n"
        "    e = estimate(s, params=1e9, num_nodes=8, max_steps=100, step_time=1.0, dtype='bf16')\n"
        "    simulate_estimate(e, 'datacenter')\n"
        "    print(s, e.params, e.trace.payload_bytes_per_step(0)[0], time.perf_counter() - t)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        name, params, first_step, seconds = line.split()
        sparse = SparseAverager(0.005)
        sparse.numel, sparse.k = int(params), round(0.005 * int(params))
        assert int(first_step) == 2 * sparse.expected_count(), name  # the expected distinct indices, in bf16
        assert float(seconds) < 30, name


def test_expected_count_is_the_mean_of_distinct_indices_drawn():
    import torch

    sparse = SparseAverager(0.05)
    sparse.bind([torch.nn.Parameter(torch.zeros(1000))], None, seed=0)
    drawn = [len(sparse.indices(step)) for step in range(400)]
    expected = 1000 * (1 - 0.999**50)  # 48.79 distinct of k = 50 draws with replacement from 1000
    assert sparse.expected_count() == round(expected) and abs(sum(drawn) / len(drawn) - expected) < 0.2


def test_solve_for_a_link_finds_the_link_bandwidth_where_nic_bandwidth_cannot_help():
    e = estimate("diloco:H=10", params=1e8, num_nodes=4, max_steps=30, step_time=0.1, layers=4)
    assert bandwidth_for_utilization(e, TWO_REGIONS, 0.5) is None  # the 1 Gbit/s link is the bottleneck
    need = bandwidth_for_utilization(e, TWO_REGIONS, 0.5, solve_for="link:eu/us")
    assert need is not None
    assert utilization_at(e, TWO_REGIONS, need, "link") >= 0.5 > utilization_at(e, TWO_REGIONS, need / 1.02, "link")


@pytest.mark.parametrize("solve_for, text", [
    ("link:us/asia", r"no link between asia and us .*its links: eu/us"),
    ("link:us/ue", r"did you mean 'eu/us'"),
])
def test_solve_for_an_unknown_link_names_the_scenarios_links(solve_for, text):
    e = estimate("ddp", params=1e6, num_nodes=4, max_steps=1, step_time=0.1)
    with pytest.raises(ScenarioError, match=text):
        bandwidth_for_utilization(e, TWO_REGIONS, 0.5, solve_for=solve_for)


def test_cli_solves_for_the_link_in_words(tmp_path, capsys):
    path = tmp_path / "two.toml"
    path.write_text('name = "two-regions"\n[network]\nbandwidth = "100 Gbit/s"\nlatency = "1 ms"\n'
                    '[[regions]]\nname = "us"\nshare = 0.5\n[[regions]]\nname = "eu"\nshare = 0.5\n'
                    '[[links]]\nbetween = ["us", "eu"]\nbandwidth = "1 Gbit/s"\nlatency = "40 ms"\n')
    args = ["estimate", "--model-params", "1e8", "--layers", "4", "--strategy", "diloco:H=10", "--nodes", "4",
            "--steps", "30", "--step-time", "0.1", "--scenario", str(path), "--solve-utilization", "0.5"]
    out = capsys.readouterr().out if main(args) == 0 else ""
    assert "is out of reach: no bandwidth per NIC gets there (the eu/us link at 1 Gbit/s bound it" in out
    assert main([*args, "--solve-for", "link"]) == 0
    assert "compute utilisation 50% needs" in (out := capsys.readouterr().out) and "on the inter-region link" in out


THREE_SITES = {"name": "three-sites", "network": {"bandwidth": "100 Gbit/s", "latency": "1 ms"},
               "regions": [{"name": n, "ranks": [i, i + 3]} for i, n in enumerate(("us", "eu", "asia"))],
               "links": [{"between": pair, "bandwidth": "1 Gbit/s", "latency": "40 ms"}
                         for pair in (["us", "eu"], ["eu", "asia"], ["us", "asia"])]}


def test_a_mesh_of_three_sites_is_solved_for_all_its_links_together():
    """One link alone cannot lift a three-site mesh: the message names the two left fixed; all three alike can."""
    from exonet.estimate.solver import links_named, what_bounds

    e = estimate("diloco:H=10", params=1e8, num_nodes=6, max_steps=30, step_time=0.1, layers=4)
    assert links_named(THREE_SITES, "links") == [("eu", "us"), ("asia", "eu"), ("asia", "us")]
    assert links_named(THREE_SITES, "link:us/eu,asia/eu") == [("eu", "us"), ("asia", "eu")]
    assert bandwidth_for_utilization(e, THREE_SITES, 0.5, solve_for="link:eu/us") is None
    assert what_bounds(e, THREE_SITES, 0.5, "link:eu/us") == (
        "the asia/eu link at 1 Gbit/s and the asia/us link at 1 Gbit/s bound it (vary them too: --solve-for links, "
        "or nic)")
    need = bandwidth_for_utilization(e, THREE_SITES, 0.5, solve_for="links")
    assert need is not None
    assert utilization_at(e, THREE_SITES, need, "links") >= 0.5 > utilization_at(e, THREE_SITES, need / 1.02, "links")
    assert "latency, the TCP window, set-up or uneven compute bound it" in what_bounds(e, THREE_SITES, 0.99999, "links")


def test_solving_for_nics_under_a_slow_link_names_the_link():
    from exonet.estimate.solver import what_bounds

    e = estimate("diloco:H=10", params=1e8, num_nodes=4, max_steps=30, step_time=0.1, layers=4)
    assert what_bounds(e, TWO_REGIONS, 0.5) == "the eu/us link at 1 Gbit/s bound it (vary them too: --solve-for " \
        "links, or nic)"


def test_scaled_warns_that_it_keeps_ddp_buckets_and_not_for_one_collective_a_step():
    bucketed, single = Trace(num_nodes=2), Trace(num_nodes=2)
    for r in range(2):
        for _ in range(2):
            bucketed.add_collective(r, "all_reduce", 100, async_op=False)
        single.add_collective(r, "all_reduce", 200)
        bucketed.add_step(r)
        single.add_step(r)
    with pytest.warns(UserWarning, match="keeps their number"):
        assert bucketed.scaled(bytes=10).payload_bytes(0) == 2000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        single.scaled(bytes=10)
        bucketed.scaled(compute=2)


def test_cli_times_each_scenario_on_its_own_device_and_counts_trainers_only(capsys, tmp_path):
    """Several --scenario with --tokens-per-step: each took the first one's device, so a result depended on
    the flags' order; a server's bytes were spread over the trainers (wire per node doubled); work a
    deadline threw away read as 100% utilisation with no goodput; a [hosts] scenario's device failed."""
    args = ["--model-params", "1e8", "--layers", "4", "--strategy", "diloco:H=5", "--nodes", "4", "--steps", "10",
            "--tokens-per-step", "4096"]
    both = cli_json(capsys, *args, "--scenario", "datacenter", "--scenario", "home-broadband")["scenarios"]
    alone = [cli_json(capsys, *args, "--scenario", name)["scenarios"][0] for name in ("datacenter", "home-broadband")]
    assert [r["wall_clock_s"] for r in both] == [r["wall_clock_s"] for r in alone]
    assert "the device of scenario 'home-broadband'" in " ".join(both[1]["assumptions"])
    step = ["--model-params", "1e6", "--nodes", "4", "--steps", "20", "--scenario", "datacenter", "--step-time", "1"]
    served = cli_json(capsys, *step, "--strategy", "async_diloco:H=10")
    row = served["scenarios"][0]
    assert row["wire_bytes_per_node"] == served["payload_bytes_per_node"] > 0  # a trainer sends what it passes in
    assert served["servers"] == 1 and "servers" not in cli_json(capsys, *step, "--strategy", "ddp")
    assert main(["estimate", *step[:-4], "--scenario", "cross-region", "--step-time", "1",
                 "--strategy", "async_diloco:H=10"]) == 0
    assert "wire bytes per node (the servers' sends included): inter-region" in capsys.readouterr().out
    late = cli_json(capsys, *step, "--strategy", "diloco:H=5,deadline_s=2")["scenarios"][0]  # every round is late
    assert late["goodput"] == 0.0 and late["lost_s"]["lost_work"] > 0 and late["utilization"] > 0.99
    hosts = tmp_path / "hosts8.toml"
    hosts.write_text('name = "hosts8"\n[network]\nbandwidth = "100 Gbit/s"\n[compute]\nmode = "flops"\n'
                     'tflops = 989.0\nmfu = 0.4\n[hosts]\ndevices = 8\nbandwidth = "450 GB/s"\n')
    args16 = ["--model-params", "1e6", "--strategy", "ddp", "--nodes", "16", "--steps", "2", "--tokens-per-step", "512"]
    assert cli_json(capsys, *args16, "--scenario", str(hosts))["scenarios"][0]["utilization"] > 0
    assert main(["estimate", *step, "--strategy", "ddp", "--solve-utilization", "0.5,"]) == 2
    assert "--solve-utilization '0.5,': expected compute utilisations" in capsys.readouterr().err


def test_an_estimate_under_failures_reports_goodput_and_the_time_lost(capsys, tmp_path):
    failing = tmp_path / "failing.toml"
    failing.write_text('name = "failing"\n[network]\nbandwidth = "10 Gbit/s"\nlatency = "1 ms"\n'
                       '[failures]\nmtbf = "30 s"\nrepair = "5 s"\nrestart = "1 s"\nseed = 0\n')
    args = ["--model-params", "1e6", "--strategy", "ddp", "--nodes", "4", "--steps", "20", "--step-time", "1"]
    report = cli_json(capsys, *args, "--scenario", str(failing))
    row = report["scenarios"][0]
    assert row["failures"] > 0 and 0 < row["goodput"] < row["utilization"] <= 1
    machine = 4 * row["wall_clock_s"]
    assert row["goodput"] * machine + sum(row["lost_s"].values()) == pytest.approx(machine, rel=1e-9)
    assert "goodput" not in cli_json(capsys, *args, "--scenario", "datacenter")["scenarios"][0]
    assert main(["estimate", *args, "--scenario", str(failing)]) == 0
    assert "failures, goodput" in capsys.readouterr().out


def test_flatten_on_the_meta_device_makes_the_buffer_torch_cat_would() -> None:
    """An estimate's strategies flatten meta tensors; the shortcut gives torch.cat's shape and dtype, and tensors of
    several dtypes (or with data) still go through torch.cat, which promotes them."""
    import torch

    from exonet.strategies.base import flatten

    parts = [torch.empty(3, 4, device="meta", dtype=torch.bfloat16),
             torch.empty(5, device="meta", dtype=torch.bfloat16)]
    flat, cat = flatten(parts), torch.cat([p.reshape(-1) for p in parts])
    assert (flat.shape, flat.dtype, flat.is_meta) == (cat.shape, cat.dtype, True) == ((17,), torch.bfloat16, True)
    mixed = [parts[0], torch.empty(2, device="meta", dtype=torch.float32)]
    assert (flatten(mixed).shape, flatten(mixed).dtype) == ((14,), torch.float32)
    assert flatten([torch.ones(2), torch.zeros(1)]).tolist() == [1.0, 1.0, 0.0]
    learned = [torch.empty(2, device="meta", requires_grad=True)]  # autograd records the cat: torch.cat's answer
    assert flatten(learned).requires_grad and not flatten([learned[0].detach()]).requires_grad
