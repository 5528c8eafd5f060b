"""estimate --profile: a torch.profiler trace of a real model replayed as measured, layer by layer."""

from __future__ import annotations

import gzip
import json
import statistics
import sys
import warnings
from pathlib import Path

import pytest
import torch

from exonet import TraceError
from exonet.bench.profile import write_trace
from exonet.cli import compute_per_step, main
from exonet.estimate import estimate, simulate_estimate
from exonet.profile import measure, read_profile
from exonet.profile.kineto import BLOCKED, MIN_STEPS, STEP_COMPUTE
from exonet.trace import Compute, Step, Trace

GPT = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
        x = x + self.proj(nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """nanoGPT's shape, small: token and position embeddings, blocks, a final norm, a tied head."""

    def __init__(self, vocab=128, d=64, layers=4, block=32):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt():
    return GPT()


def deep():
    return GPT(layers=16)
'''


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """The small GPT trained for 6 steps under torch.profiler (the first a warm-up), its trace's path."""
    folder = tmp_path_factory.mktemp("gpt")
    (folder / "tinygpt.py").write_text(GPT)
    sys.path.insert(0, str(folder))
    import tinygpt

    torch.manual_seed(0)
    model = tinygpt.gpt()
    opt = torch.optim.AdamW(model.parameters())
    data = torch.randint(0, 128, (8, 32))
    path = folder / "trace.json"
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=5, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                record_shapes=True, on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(6):
            loss = torch.nn.functional.cross_entropy(model(data).flatten(0, 1), data.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    yield path
    sys.path.remove(str(folder))


def median_step(path) -> float:
    """The profiled steps' median, read here on its own: ProfilerStep spans, the first dropped."""
    events = json.loads(path.read_text())["traceEvents"]
    spans = sorted((e["ts"], e["dur"]) for e in events if e.get("name", "").startswith("ProfilerStep#"))
    return statistics.median(d for _, d in spans[1:]) * 1e-6


def test_a_profiled_gpt_is_replayed_at_its_own_step_time_by_ddp_and_diloco(profiled, capsys):
    """Compute per step was 6·P·tokens at a guessed MFU: here it is the profiled step's median, within 5%."""
    want = median_step(profiled)
    profile = read_profile(profiled)
    assert profile.steps_used == 4 and profile.warmup_dropped and "dropped as warm-up" in profile.notes[0]
    assert profile.step_s == pytest.approx(want)
    assert len(profile.backward_s) == 52  # the tied head is one tensor: one AccumulateGrad
    assert main(["estimate", "--model", "tinygpt:gpt", "--profile", str(profiled), "--strategy", "ddp", "--nodes", "8",
                 "--steps", "3", "--scenario", "datacenter", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["compute_s_per_step"] == pytest.approx(want, rel=0.05)
    est = estimate("diloco:H=8", model="tinygpt:gpt", profile=profiled, num_nodes=8, max_steps=8)
    assert compute_per_step(simulate_estimate(est, "cross-region")) == pytest.approx(want, rel=0.05)
    assert any("measured by torch.profiler" in a for a in est.assumptions)


def test_the_text_prints_the_profiled_step_and_the_mfu_it_implies(profiled, capsys):
    assert main(["estimate", "--model", "tinygpt:gpt", "--profile", str(profiled), "--strategy", "ddp", "--nodes", "2",
                 "--steps", "2", "--scenario", "datacenter", "--tokens-per-step", "256", "--tflops", "1"]) == 0
    out = capsys.readouterr().out
    step = read_profile(profiled).step_s
    flops = 6 * sum(p.numel() for p in _model("gpt").parameters()) * 256
    assert "profiled step:" in out and "the first dropped as warm-up" in out
    assert f"implies MFU {100 * flops / (step * 1e12):.3g}%" in out
    assert "at MFU 0.4 would be" in out


def _model(name: str) -> torch.nn.Module:
    import tinygpt

    with torch.device("meta"):
        return getattr(tinygpt, name)()


def test_scale_layers_times_the_unprofiled_blocks_as_the_profiled_ones(profiled):
    """4 profiled blocks of 16: each block's backward and forward counted 4 times, the ends once."""
    profile = read_profile(profiled)
    small, big = measure(profile, _model("gpt")), measure(profile, _model("deep"), scale_layers=4)
    assert len(big.order) == 2 + 16 * 12 + 2 and sorted(big.order) == list(range(len(big.order)))
    block_backward = sum(profile.backward_s[2:-2])  # head/ln_f first, the embeddings last
    assert sum(big.backward_s) == pytest.approx(sum(small.backward_s) + 3 * block_backward)
    share = block_backward / sum(profile.backward_s)  # no module annotations: forward shared as backward is
    assert big.forward_s == pytest.approx(profile.forward_s * (1 + 3 * share))
    assert any("from 4 to 16 blocks" in n for n in big.notes)
    faster = measure(profile, _model("gpt"), devices=("A100", "H100"))
    assert faster.step_s == pytest.approx(small.step_s * 312 / 989)
    assert any(n.startswith("caution: compute scaled from A100") for n in faster.notes)


LAYERS, WIDTH = 4, 512  # four 1 MiB weights: with bucket_cap_mb=1 every one is a bucket of its own


def stack() -> torch.nn.Module:
    return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)))


def test_a_slow_last_layer_delays_ddp_buckets_as_measured(tmp_path):
    """The last layer's backward takes 10 b, the others b: its gradient, and so every bucket, is ready late.

    K=2, ring, no latency: a 1 MiB all-reduce takes S/B = 2 b. Buckets are ready at 10, 11, 12, 13 b into
    backward and run one after another: they end at 12, 14, 16, 18 b, so 5 b of communication is exposed
    after backward (even spacing, ready at 3.25, 6.5, 9.75, 13 b, would expose 2 b).
    """
    b, forward, tail = 1e-3, 4e-3, 1e-3
    shape = [WIDTH, WIDTH]
    path = write_trace(tmp_path / "slow.json", steps=3, forward_us=forward * 1e6,
                       grads=[(10 * b * 1e6, shape)] + [(b * 1e6, shape)] * 3, tail_us=tail * 1e6)
    scenario = {"name": "lan", "network": {"bandwidth": f"{8 * WIDTH * WIDTH * 4 / (2 * b)!r} bit/s"}}
    est = estimate("ddp:bucket_cap_mb=1", model=stack, profile=path, num_nodes=2, max_steps=1)
    sim = simulate_estimate(est, scenario)
    assert sim.wall_clock_s == pytest.approx(forward + 13 * b + 5 * b + tail, rel=1e-9)
    even = estimate("ddp:bucket_cap_mb=1", model=stack, step_time=forward + 13 * b + tail, num_nodes=2, max_steps=1)
    assert simulate_estimate(even, scenario).wall_clock_s < sim.wall_clock_s - 2 * b


def test_per_node_tokens_give_a_smaller_batch_a_shorter_step(profiled):
    est = estimate("ddp", model="tinygpt:gpt", profile=profiled, num_nodes=3, max_steps=2,
                   tokens_per_step=[256, 256, 128])
    per_node = [p.compute_s for p in simulate_estimate(est, "datacenter").per_node]
    assert per_node[2] == pytest.approx(per_node[0] / 2) and per_node[1] == pytest.approx(per_node[0])
    flops = estimate("ddp", params=1e6, layers=2, num_nodes=2, max_steps=1, tokens_per_step=[1000, 500], tflops=1)
    assert [p.compute_s for p in simulate_estimate(flops, "datacenter").per_node] == pytest.approx(
        [6e6 * 1000 / 0.4e12, 6e6 * 500 / 0.4e12])
    with pytest.raises(ValueError, match="2 per-node values for 3 nodes"):
        estimate("ddp", params=1e6, layers=2, num_nodes=3, max_steps=1, tokens_per_step=[1, 2], tflops=1)


def test_a_gpu_trace_is_read_on_a_cpu_machine_by_its_kernels(tmp_path):
    """Gradients are ready when the kernels launched before them end, and the idle device is measured."""
    path = write_trace(tmp_path / "gpu.json.gz.tmp", steps=2, forward_us=1000.0, grads=[(100.0, [4])],
                       tail_us=100.0, filler=10, gpu=True)
    zipped = tmp_path / "gpu.json.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    profile = read_profile(zipped)
    assert profile.device == "NVIDIA H100 80GB HBM3"
    assert profile.idle_s == pytest.approx((1200 - 10 * 50) * 1e-6)  # kernels of half of each filler's 100 µs


@pytest.mark.parametrize(("text", "missing"), [
    ("not json at all", "not Kineto's Chrome-trace JSON"),
    ('{"traces": []}', "'traceEvents' list"),
    ('{"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 0, "dur": 1}]}', "no ProfilerStep span"),
    ('{"traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "ts": 0, "dur": 9}]}', "has no backward"),
])
def test_a_trace_that_is_not_a_profiled_training_step_is_named_with_what_it_lacks(tmp_path, text, missing):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=missing) as caught:
        read_profile(path)
    assert str(path) in str(caught.value)


def test_a_model_that_does_not_match_the_trace_is_an_error_naming_the_file(tmp_path, capsys):
    path = write_trace(tmp_path / "t.json", steps=2, forward_us=10.0, grads=[(1.0, [WIDTH, WIDTH])] * LAYERS,
                       tail_us=1.0)
    with pytest.raises(TraceError, match=f"{path}: the profiled step has 4 gradients .* but the model has 2"):
        estimate("ddp", model=lambda: torch.nn.Sequential(*stack()[:2]), profile=path, num_nodes=2, max_steps=1)
    with pytest.raises(TraceError, match=r"gradient 0 of the profiled step has shape \[512, 512\]"):
        measure(read_profile(path), torch.nn.Sequential(*(torch.nn.Linear(8, 8, bias=False) for _ in range(4))))
    assert main(["estimate", "--model", "exonet.toy:bench_mlp", "--profile", str(path), "--strategy", "ddp",
                 "--nodes", "2", "--steps", "1", "--scenario", "datacenter"]) == 2
    assert str(path) in capsys.readouterr().err
    with pytest.raises(ValueError, match="give profile= too"):
        estimate("ddp", model=stack, step_time=1.0, num_nodes=2, max_steps=1, scale_layers=2)


def test_the_profile_bench_reads_a_generated_trace_and_reports_its_figures(capsys):
    from exonet.bench.profile import main as bench

    figures = bench(["--mb", "1"])
    assert figures["ok"] and figures["gradients"] == 200 and figures["device"].startswith("NVIDIA")
    assert 0.5e6 < figures["trace_bytes"] < 2e6 and figures["read_s"] > 0 and figures["peak_bytes"] >= 0
    assert "MB trace in" in capsys.readouterr().out


def test_exposed_communication_in_a_profiled_step_is_left_out(tmp_path):
    """A step profiled inside a distributed run waits on gloo: that wait is the simulator's to time, not compute."""
    path = write_trace(tmp_path / "t.json", steps=2, forward_us=1000.0, grads=[(100.0, [4])], tail_us=500.0)
    data = json.loads(path.read_text())
    for s in range(2):  # 300 µs of all-reduce on gloo's thread, in the tail, while the main thread waits
        data["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": 1, "tid": 9,
                                    "ts": 1000.0 + s * 1600 + 1150, "dur": 300.0})
    path.write_text(json.dumps(data))
    profile = read_profile(path)
    assert profile.comm_s == pytest.approx(300e-6) and profile.step_s == pytest.approx(1300e-6)
    assert profile.tail_s == pytest.approx(200e-6) and profile.forward_s == pytest.approx(1000e-6)
    assert any("exposed communication" in n for n in profile.notes)


def test_a_wait_marked_by_the_node_is_communication_even_where_no_backend_op_runs(tmp_path):
    """fit(profile=True) marks each call a node blocks in as ``exonet::<call>``: a descheduled wait, in which
    neither the node nor gloo's thread records an op, is still left out of compute, as the trace leaves it."""
    path = write_trace(tmp_path / "t.json", steps=2, forward_us=1000.0, grads=[(100.0, [4])], tail_us=500.0)
    data = json.loads(path.read_text())
    for s in range(2):
        data["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": f"{BLOCKED}wait", "pid": 1,
                                    "tid": 1, "ts": 1000.0 + s * 1600 + 1150, "dur": 300.0})
    path.write_text(json.dumps(data))
    profile = read_profile(path)
    assert profile.comm_s == pytest.approx(300e-6) and profile.step_s == pytest.approx(1300e-6)


@pytest.mark.parametrize("steps, unprofiled", [(7, 0), (8, 2), (16, 4), (24, 6), (100, 25)])
def test_a_profiled_fit_leaves_its_first_quarter_unprofiled_where_both_parts_keep_enough_steps(steps, unprofiled):
    from exonet.profile.record import reference_steps

    assert reference_steps(steps) == unprofiled
    assert unprofiled == 0 or steps - unprofiled >= MIN_STEPS + 1


def test_the_traced_compute_of_unprofiled_steps_is_the_step_and_the_profilers_overhead_is_said(tmp_path):
    """The profile splits the step; the run's trace, without the profiler, says how long it is."""
    path = write_trace(tmp_path / "t.json", steps=6, forward_us=1000.0, grads=[(300.0, [4]), (100.0, [4])],
                       tail_us=600.0)
    bare = read_profile(path)
    assert bare.overhead is None and bare.step_s == pytest.approx(2e-3)
    assert any("overhead is in these figures" in n for n in bare.notes)
    data = json.loads(path.read_text())
    data[STEP_COMPUTE] = {"unprofiled_s": [1.5e-3, 1.7e-3, 1.6e-3], "profiled_s": [2.1e-3, 2.0e-3, 1.9e-3]}
    path.write_text(json.dumps(data))
    profile = read_profile(path)
    assert profile.step_s == pytest.approx(1.6e-3) and profile.overhead == pytest.approx(1 - 1.6 / 2.0)
    assert profile.forward_s == pytest.approx(0.8e-3) and profile.backward_s == pytest.approx((0.24e-3, 0.08e-3))
    assert profile.tail_s == pytest.approx(0.48e-3)
    assert any("3 steps run without the profiler, 1.6 ms" in n and "+25%" in n for n in profile.notes)
    data[STEP_COMPUTE] = {"unprofiled_s": [], "profiled_s": [2e-3]}  # too short a run: nothing to compare
    path.write_text(json.dumps(data))
    assert read_profile(path).overhead is None


def median_sim_step(sim) -> float:
    """A replay's median step (the first, start-up, aside)."""
    ends = [0.0, *sim.step_end_times]
    return statistics.median(b - a for a, b in list(zip(ends, ends[1:]))[1:])


def step_times(sim, steps: slice) -> list[float]:
    """A replay's step durations, those of ``steps``."""
    ends = [0.0, *sim.step_end_times]
    return [b - a for a, b in zip(ends, ends[1:])][steps]


def at_rank0_pace(trace: Trace) -> Trace:
    """The trace with every rank computing what rank 0 computed at the same point (a DDP trace's ranks have
    the same events, in the same order)."""
    pace = [e for e in trace.events[0] if isinstance(e, Compute)]
    events = []
    for evs in trace.events:
        computes = iter(pace)
        events.append([next(computes) if isinstance(e, Compute) else e for e in evs])
        assert sum(isinstance(e, Compute) for e in evs) == len(pace)
    return Trace(trace.num_nodes, dict(trace.meta), events)


@pytest.mark.slow
def test_a_profiled_ddp_fit_is_estimated_from_its_own_profile():
    """Held out: a real DDP fit (K=4, gloo, CPU) with profile=True, against estimate --profile of rank 0's profile.

    The profiler left the fit's first quarter unprofiled, and wrote each step's traced compute into the profile:
    the estimate's compute per step is rank 0's median over the unprofiled steps (the first, a warm-up, aside),
    split as the profile splits it, whatever the profiler's overhead and however busy the machine was.
    The estimate runs every node as rank 0 (its stated assumption), so what it must match is the real
    trace replayed with every node at rank 0's pace, over the same steps: within 10% in the datacenter
    (compute-bound) and cross-region (communication-bound). Pacing by the slowest of four nodes on two
    shared cores is the machine's, not the estimate's, and is left out of both sides.
    """
    from exonet import LocalTrainer, Scenario, simulate
    from exonet.profile.record import reference_steps
    from exonet.strategies import DDPStrategy, OptimSpec
    from exonet.toy import bench_mlp, synthetic_classification

    steps = 24
    fit = LocalTrainer(bench_mlp(), synthetic_classification(4096)).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.01)), 4, max_steps=steps, batch_size=64, val_size=0, profile=True,
        progress=False)
    assert fit.profile is not None and fit.profile.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a loaded machine's spread is warned about; it does not enter the step
        profile = read_profile(fit.profile)
        est = estimate("ddp", model="exonet.toy:bench_mlp", profile=fit.profile, num_nodes=4, max_steps=steps)
    plain = slice(1, reference_steps(steps))  # rank 0's unprofiled steps, the warm-up aside
    traced = [sum(e.wall_s for e in step if isinstance(e, Compute)) for step in _steps(fit.trace.events[0])]
    assert plain.stop == 6 and profile.step_s == pytest.approx(statistics.median(traced[plain]), rel=1e-9)
    assert profile.overhead is not None and est.step_time_s == pytest.approx(profile.step_s, rel=1e-9)
    paced = at_rank0_pace(fit.trace)
    for name in ("datacenter", "cross-region"):
        real = statistics.median(step_times(simulate(paced, Scenario.load(name).replace(compute={"mode": "wall"})),
                                            plain))
        assert median_sim_step(simulate_estimate(est, name)) == pytest.approx(real, rel=0.1), name


def _steps(events: list) -> list[list]:
    """A rank's events cut at its step boundaries."""
    steps: list[list] = [[]]
    for e in events:
        steps[-1].append(e)
        if isinstance(e, Step):
            steps.append([])
    return steps[:-1]


def test_the_cli_takes_per_node_tokens_a_deeper_stack_and_another_device(profiled, capsys):
    assert main(["estimate", "--model", "tinygpt:deep", "--profile", str(profiled), "--scale-layers", "4",
                 "--devices", "A100:H100", "--strategy", "ddp", "--nodes", "3", "--steps", "2", "--scenario",
                 "datacenter", "--tokens-per-step", "256,256,128", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    deep = measure(read_profile(profiled), _model("deep"), scale_layers=4, devices=("A100", "H100"))
    assert report["compute_s_per_step"] == pytest.approx(deep.step_s * (1 + 1 + 0.5) / 3)
    assert any("caution: compute scaled from A100" in n for n in report["profile"]["notes"])
    assert main(["estimate", "--model", "tinygpt:gpt", "--profile", str(profiled), "--strategy", "ddp", "--nodes",
                 "2", "--steps", "1", "--scenario", "datacenter", "--devices", "Z80:H100"]) == 2
    assert "unknown device 'Z80'" in capsys.readouterr().err


def test_a_top_level_stack_deepens_with_its_blocks_forward_from_module_annotations(tmp_path):
    """Blocks of an nn.Sequential (``0.weight``) deepen too; each block's forward is its ``nn.Module`` span."""
    path = write_trace(tmp_path / "t.json", steps=2, forward_us=1000.0, tail_us=10.0,
                       grads=[(300.0, [WIDTH, WIDTH]), (100.0, [WIDTH, WIDTH])],
                       modules=[("nn.Module: Linear_0", 200.0), ("nn.Module: Linear_1", 600.0)])
    profile = read_profile(path)
    assert profile.modules == pytest.approx({"Linear_0": 200e-6, "Linear_1": 600e-6})
    with torch.device("meta"):
        deep = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(8)))
    step = measure(profile, deep, scale_layers=2)
    assert step.order == (7, 6, 5, 4, 3, 2, 1, 0)  # blocks 4-7 timed as profiled block 1, 0-3 as block 0
    assert step.backward_s == pytest.approx([300e-6] * 4 + [100e-6] * 4)
    assert step.forward_s == pytest.approx(1000e-6 + 3 * (200e-6 + 600e-6))


def test_too_few_or_scattered_profiled_steps_are_said_and_warned(profiled):
    """A median of 4 steps, or of steps 5x apart, is no figure to plan with unannounced."""
    from exonet.profile.kineto import MAX_SPREAD, MIN_STEPS, _check_steps

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # this machine's own spread is not what this test is about
        profile = read_profile(profiled)
    assert profile.steps_used == MIN_STEPS - 1 and profile.spread >= 0
    assert any(f"only {MIN_STEPS - 1} profiled steps after the warm-up" in n for n in profile.notes)
    notes: list[str] = []
    with pytest.warns(UserWarning, match=r"t.json: the 5 profiled steps spread 400% around their median"):
        assert _check_steps(Path("t.json"), [0.1, 0.1, 0.1, 0.1, 0.5], 0.1, notes) == pytest.approx(4.0)
    assert len(notes) == 1 and "0.1 ms" not in notes[0] and "100 to 500 ms" in notes[0]
    quiet: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _check_steps(Path("t.json"), [0.1] * 5, 0.1, quiet) == 0.0 < MAX_SPREAD
    assert quiet == []
