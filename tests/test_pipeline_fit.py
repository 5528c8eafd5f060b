"""A model in stages trained for real: the same model as unsplit training, the trace the estimate times, replicas
kept in step by a data-parallel strategy, resume after a stage dies, and what a pipeline fit refuses."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from torch import nn

from exonet import LocalTrainer, NodeFailure, PipelineSpec, Staged
from exonet.communicator.view import GroupView
from exonet.estimate.pipeline import pipeline_trace
from exonet.runtime.boundary import LowRank, Quantized, TopK
from exonet.runtime.pipeline import stage_bounds
from exonet.runtime.testing import FailingLayer
from exonet.strategies import AsyncDiLoCoStrategy, DDPStrategy, DiLoCoStrategy, OptimSpec
from exonet.toy import staged_gpt, synthetic_classification
from exonet.trace import Collective, Wait

DATA = synthetic_classification(128, dim=8, classes=3)
VAL = synthetic_classification(32, dim=8, classes=3, train=False)
WIDTH = 16
KW: dict[str, Any] = dict(max_steps=4, batch_size=8, val_interval=2, val_size=16, seed=3, progress=False)


def layers(*extra: nn.Module) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Linear(8, WIDTH), nn.Tanh(), *extra, nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 3)]


def staged(*extra: nn.Module) -> Staged:
    return Staged(layers(*extra), nn.CrossEntropyLoss())


def strategy() -> DDPStrategy:
    return DDPStrategy(OptimSpec("adamw", lr=1e-2))


def fit(nodes: int, make: Any = strategy, pipeline: PipelineSpec | None = None, **kw: Any) -> Any:
    return LocalTrainer(staged(), DATA, VAL).fit(make(), nodes, pipeline=pipeline, **{**KW, **kw})


def assert_same_training(got: Any, want: Any) -> None:
    assert got.history["train_loss"] == pytest.approx(want.history["train_loss"], rel=1e-5)
    assert [e["loss"] for e in got.history["eval"]] == pytest.approx([e["loss"] for e in want.history["eval"]],
                                                                      rel=1e-5)
    for (name, a), b in zip(want.model.state_dict().items(), got.model.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def whole() -> Any:
    """The unsplit model on one node."""
    return fit(1)


@pytest.fixture(scope="module", params=[("gpipe", 2, 4), ("1f1b", 3, 4)], ids=["gpipe-S2-M4", "1f1b-S3-M4"])
def piped(request: pytest.FixtureRequest) -> tuple[PipelineSpec, Any]:
    schedule, stages, micro = request.param
    spec = PipelineSpec(stages=stages, micro_batches=micro, schedule=schedule)
    return spec, fit(stages, pipeline=spec)


def test_a_pipeline_trains_the_model_the_unsplit_model_trains(piped, whole):
    """Micro-batches through the stages and back give the whole batch's gradient: the same losses, evaluations
    and final model as one node training the whole model (to float rounding)."""
    assert_same_training(piped[1], whole)


def test_the_real_trace_is_the_schedule_the_estimate_times(piped):
    """Every stage's sends, receives and waits, in order and to the byte, are those of ``pipeline_trace``: a
    micro-batch's activation is its 8 / M rows × 16 float32 each way."""
    spec, result = piped
    activation = KW["batch_size"] // spec.micro_batches * WIDTH * 4
    want = pipeline_trace(spec, replicas=1, steps=KW["max_steps"], step_time=1.0, activation_bytes=activation,
                          stage_bytes=0, sync_every=0)

    def calls(trace: Any, rank: int) -> list[tuple]:
        return [(e.op, e.nbytes, e.group, e.async_op) if type(e) is Collective else ("wait",)
                for e in trace.events[rank] if type(e) in (Collective, Wait)]

    for rank in range(spec.stages):
        assert calls(result.trace, rank) == calls(want, rank), rank
    assert result.trace.meta["pipeline"] == {"stages": spec.stages, "micro_batches": spec.micro_batches,
                                             "schedule": spec.schedule, "activation_bytes": None, "cuts": None,
                                             "codec": None, "routing": None, "skip": 0.0}


def tokens(n: int, seed: int) -> torch.utils.data.TensorDataset:
    ids = torch.randint(16, (n, 9), generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.TensorDataset(ids[:, :-1], ids[:, 1:])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_small_gpt_in_four_stages_trains_as_the_unsplit_gpt(schedule):
    """The embedding, two transformer blocks and the head on four nodes, four micro-batches: every step's loss,
    every evaluation and the final weights are those of the whole GPT on one node (fixed seeds, float rounding).
    SGD, not Adam: the keys' bias has a gradient of zero up to rounding, which Adam's normalisation would turn
    into whole steps of either sign."""
    data, val = tokens(64, 0), tokens(16, 1)
    kw = {**KW, "max_steps": 3, "val_interval": 3}

    def sgd() -> DDPStrategy:
        return DDPStrategy(OptimSpec("sgd", lr=0.3))

    whole = LocalTrainer(staged_gpt(16, 8, width=16, layers=2, heads=2), data, val).fit(sgd(), 1, **kw)
    piped = LocalTrainer(staged_gpt(16, 8, width=16, layers=2, heads=2), data, val).fit(
        sgd(), 4, pipeline=PipelineSpec(4, 4, schedule), **kw)
    assert_same_training(piped, whole)
    assert len(piped.history["train_loss"]) == 3


@pytest.mark.parametrize("make", [strategy, lambda: DiLoCoStrategy(H=2)], ids=["ddp", "diloco"])
def test_stage_replicas_kept_in_step_by_a_strategy_train_as_its_nodes_do(make):
    """Two replicas of two stages under DDP (or DiLoCo) train what two nodes of the whole model train under it;
    each stage's replicas exchange only their stage's parameters."""
    got = fit(4, make, PipelineSpec(stages=2, micro_batches=2))
    assert_same_training(got, fit(2, make))
    first = 8 * WIDTH + WIDTH  # stage 0: the first Linear; stage 1: the other two
    synced = {rank: {e.nbytes for e in got.trace.collectives(rank) if e.op == "all_reduce"} for rank in range(4)}
    assert synced == {0: {first * 4}, 2: {first * 4}, 1: {(WIDTH * WIDTH + WIDTH + WIDTH * 3 + 3) * 4},
                      3: {(WIDTH * WIDTH + WIDTH + WIDTH * 3 + 3) * 4}}
    assert {e.group for r in range(4) for e in got.trace.collectives(r) if e.op == "all_reduce"} == {(0, 2), (1, 3)}


def messages(trace: Any, rank: int) -> list[tuple]:
    """A rank's point-to-point calls: op, bytes and (source, destination)."""
    return [(e.op, e.nbytes, e.group) for e in trace.collectives(rank) if e.op in ("send", "recv")]


@pytest.mark.parametrize("routing", ["random", "balanced"])
def test_micro_batches_routed_between_stage_replicas_train_as_ddp_nodes(routing):
    """Two replicas of three stages, each micro-batch routed to a replica of every later stage (SWARM), under
    DDP: what reaches a stage replica varies, but DDP averages its replicas' gradients, whose sum routing leaves
    as it was, so the run trains what two whole-model DDP nodes train. Its sends and receives, rank by rank, are
    those of the estimate's routed trace (the fit's seed draws both), and some cross between replicas."""
    spec = PipelineSpec(stages=3, micro_batches=2, schedule="gpipe", routing=routing)
    got = fit(6, pipeline=spec)
    assert_same_training(got, fit(2))
    want = pipeline_trace(spec, replicas=2, steps=KW["max_steps"], step_time=1.0, stage_bytes=0, sync_every=0,
                          activation_bytes=KW["batch_size"] // 2 * WIDTH * 4, seed=KW["seed"])

    for rank in range(6):
        assert messages(got.trace, rank) == messages(want, rank), rank
    assert any(c.group[0] // 3 != c.group[1] // 3 for r in range(6) for c in got.trace.collectives(r) if c.op == "send")


def test_a_routed_diloco_pipeline_reports_one_loss_a_step_and_learns():
    """Under DiLoCo the replicas' inner steps see what routing gave them; the step's loss is the mean over both
    replicas' batches, reported once (by replica 0's last stage), and it falls."""
    got = fit(4, lambda: DiLoCoStrategy(OptimSpec("adamw", lr=1e-2), H=2),
              PipelineSpec(stages=2, micro_batches=4, schedule="gpipe", routing="random"), max_steps=12)
    losses = got.history["train_loss"]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) < sum(losses[:3])


def test_a_stage_every_micro_batch_skips_leaves_the_model_that_trains_without_it():
    """SkipPipe at skip=1: every micro-batch passes over the middle stage, stage 0 sending to stage 2 directly,
    so three stages train what the model without the middle layers trains on one node (losses to 1e-5), and
    the middle layers, whose gradient is zero, stay as they began (SGD)."""
    def sgd() -> DDPStrategy:
        return DDPStrategy(OptimSpec("sgd", lr=0.3))

    full = layers()
    kw = {**KW, "val_interval": 0}
    skipped = LocalTrainer(Staged(full, nn.CrossEntropyLoss()), DATA, VAL).fit(
        sgd(), 3, pipeline=PipelineSpec(3, 2, "gpipe", cuts=(2, 4), skip=1.0), **kw)
    without = LocalTrainer(Staged(layers()[:2] + layers()[4:], nn.CrossEntropyLoss()), DATA, VAL).fit(sgd(), 1, **kw)
    assert skipped.history["train_loss"] == pytest.approx(without.history["train_loss"], rel=1e-5)
    state = skipped.model.state_dict()
    for name, value in without.model.state_dict().items():
        index, rest = name.split(".")[1], name.split(".", 2)[2]
        torch.testing.assert_close(state[f"layers.{int(index) + 2 * (int(index) >= 2)}.{rest}"], value)
    torch.testing.assert_close(state["layers.2.weight"], full[2].weight)
    assert {c.group for c in skipped.trace.collectives(0) if c.op == "send"} == {(0, 2)}
    assert not [c for c in skipped.trace.collectives(1) if c.op in ("send", "recv")]


def test_skipped_and_routed_micro_batches_send_what_the_estimate_says():
    """Routing and skipping together: each rank's sends and receives are the estimate's, drawn from the same seed;
    some go from stage 0 straight to stage 2."""
    spec = PipelineSpec(stages=3, micro_batches=2, schedule="gpipe", routing="balanced", skip=0.5, cuts=(2, 4))
    got = fit(6, pipeline=spec)
    want = pipeline_trace(spec, replicas=2, steps=KW["max_steps"], step_time=1.0, stage_bytes=0, sync_every=0,
                          activation_bytes=KW["batch_size"] // 2 * WIDTH * 4, seed=KW["seed"])
    for rank in range(6):
        assert messages(got.trace, rank) == messages(want, rank), rank
    assert any(c.group[0] % 3 == 0 and c.group[1] % 3 == 2 for c in got.trace.collectives(0) if c.op == "send")
    assert all(math.isfinite(x) for x in got.history["train_loss"])


def test_a_routed_pipeline_resumed_from_its_checkpoint_routes_as_the_run_it_resumes(tmp_path):
    """Paths are drawn from the step: a run resumed at step 4 of 6 (DiLoCo, where routing changes the model)
    ends bit-identical to the run it resumes."""
    spec = PipelineSpec(stages=2, micro_batches=4, schedule="gpipe", routing="random")
    kw = {**KW, "max_steps": 6, "checkpoint_interval": 4}
    first = fit(4, lambda: DiLoCoStrategy(H=2), spec, run_dir=tmp_path, **kw)
    (run,) = tmp_path.iterdir()
    resumed = fit(4, lambda: DiLoCoStrategy(H=2), spec, resume_from=run, **kw)
    assert resumed.history["train_loss"] == first.history["train_loss"]
    for (name, a), b in zip(first.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_pipeline_whose_stage_dies_resumes_to_the_uninterrupted_run(tmp_path):
    """Stage 1 is killed in step 5 after the checkpoint at step 4; the resumed run equals one never stopped."""
    spec = PipelineSpec(stages=2, micro_batches=2, cuts=(2,))  # stage 1 starts at the failing layer
    kw = {**KW, "max_steps": 6, "checkpoint_interval": 2}
    # stage 1's forwards: one probe of its shapes, then two per step: the 12th is in step 5 (0-based)
    killer = Staged(layers(FailingLayer(fail_rank=1, call=12)), nn.CrossEntropyLoss())
    with pytest.raises(NodeFailure, match="SIGKILL") as info:
        LocalTrainer(killer, DATA, VAL).fit(strategy(), 2, pipeline=spec, run_dir=tmp_path, **kw)
    assert info.value.rank == 1
    (run,) = tmp_path.iterdir()
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 4
    healthy = Staged(layers(FailingLayer(fail_rank=-1, call=0)), nn.CrossEntropyLoss())
    resumed = LocalTrainer(healthy, DATA, VAL).fit(strategy(), 2, pipeline=spec, resume_from=run, **kw)
    plain = Staged(layers(FailingLayer(fail_rank=-1, call=0)), nn.CrossEntropyLoss())
    reference = LocalTrainer(plain, DATA, VAL).fit(strategy(), 2, pipeline=spec, **{**kw, "checkpoint_interval": None})
    assert resumed.history["train_loss"] == reference.history["train_loss"]
    for (name, a), b in zip(reference.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(("model", "nodes", "kw", "error", "message"), [
    (lambda: nn.Sequential(nn.Linear(8, 3)), 2, {}, TypeError, r"pipeline= cuts an exonet.Staged"),
    (staged, 3, {}, ValueError, r"num_nodes=3 is not a multiple of pipeline.stages=2"),
    (staged, 2, {"batch_size": 6}, ValueError, r"batch_size=6 does not divide into pipeline.micro_batches=4"),
    (staged, 2, {"minibatch_size": 4}, ValueError, r"minibatch_size .* pipeline.micro_batches does that"),
    (staged, 2, {"pipeline": PipelineSpec(2, 4, cuts=(5,))}, ValueError, r"cuts must be 1 increasing layer "
                                                                         r"indices in \(0, 5\), got \(5,\)"),
    (staged, 6, {"pipeline": PipelineSpec(6)}, ValueError, r"stages=6 is more than the model's 5 layers"),
    (staged, 4, {"pipeline": PipelineSpec(4)}, ValueError, r"stage 1 \(layers 1..1\) has no trainable parameters"),
    (staged, 2, {"pipeline": "2 stages"}, TypeError, r"pipeline must be an exonet.PipelineSpec, got str"),
])
def test_what_a_pipeline_fit_cannot_take_is_named(model, nodes, kw, error, message):
    args = {**KW, "pipeline": PipelineSpec(2, 4), **kw}
    with pytest.raises(error, match=message):
        LocalTrainer(model(), DATA, VAL).fit(strategy(), nodes, **args)


def test_stages_whose_shapes_do_not_chain_are_named_before_any_node_starts(node_pids):
    broken = Staged([nn.Linear(8, WIDTH), nn.Tanh(), nn.Linear(WIDTH + 1, 3)], nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match=r"pipeline stage 1 \(layers 1..2\) cannot take stage 0's output "
                                         r"\(shape \(1, 16\), torch.float32\): RuntimeError"):
        LocalTrainer(broken, DATA, VAL).fit(strategy(), 2, pipeline=PipelineSpec(2, 4, cuts=(1,)), **KW)
    wrong_loss = Staged(layers(), nn.CosineEmbeddingLoss())  # wants three arguments
    with pytest.raises(ValueError, match=r"the Staged model's loss cannot take the last stage's output"):
        LocalTrainer(wrong_loss, DATA, VAL).fit(strategy(), 2, pipeline=PipelineSpec(2, 4), **KW)
    narrowing = Staged([nn.Linear(8, WIDTH), nn.Linear(WIDTH, 12), nn.Linear(12, 3)], nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match=r"pipeline.skip=0.5 passes over stage 1 \(layers 1..1\), so its output must "
                                         r"have its input's shape and dtype: it takes shape \(1, 16\)"):
        LocalTrainer(narrowing, DATA, VAL).fit(strategy(), 3, pipeline=PipelineSpec(3, 4, "gpipe", skip=0.5), **KW)
    assert broken.training and node_pids() == []


def test_an_asynchronous_strategy_cannot_keep_stage_replicas_in_step():
    with pytest.raises(ValueError, match=r"AsyncDiLoCoStrategy .* cannot keep them"):
        LocalTrainer(staged(), DATA, VAL).fit(AsyncDiLoCoStrategy(H=2), 4, pipeline=PipelineSpec(2),
                                              scenario="datacenter", **KW)


def test_cuts_balance_the_parameters_and_keep_a_layer_in_every_stage():
    model = staged()  # parameters per layer: 144, 0, 272, 0, 51; the largest stage is as small as it can be
    assert stage_bounds(model, PipelineSpec(2)) == [(0, 1), (1, 5)]
    assert stage_bounds(model, PipelineSpec(3)) == [(0, 1), (1, 3), (3, 5)]
    assert stage_bounds(model, PipelineSpec(5)) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert stage_bounds(model, PipelineSpec(2, cuts=(1,))) == [(0, 1), (1, 5)]


class _Comm:
    """A Communicator double that records what the view asks of it."""

    def __init__(self, rank: int) -> None:
        self.rank, self.world_size, self.calls = rank, 6, []
        self.next_cid = 0

    def all_reduce(self, tensor, op="sum", group=None, async_op=False):
        self.calls.append(("all_reduce", op, group, async_op))
        return tensor

    def broadcast(self, tensor, src=0, group=None, async_op=False):
        self.calls.append(("broadcast", src, group))
        return tensor

    def all_gather(self, tensor, group=None, async_op=False):
        self.calls.append(("all_gather", group))
        return tensor

    def send(self, tensor, dst, async_op=False):
        self.calls.append(("send", dst))

    def declare_groups(self, groups):
        self.calls.append(("declare", groups))

    def put(self, key, tensor):
        self.calls.append(("put", key))


def test_a_group_view_numbers_the_replicas_and_runs_the_strategys_calls_on_them():
    """Stage 1 of 3 stages × 2 replicas is ranks (1, 4): rank 4 is the view's rank 1 of 2."""
    comm = _Comm(4)
    siblings = [[s, s + 3] for s in range(3)]
    view = GroupView(comm, siblings[1], siblings, "stage1/")
    assert (view.rank, view.world_size) == (1, 2)
    t = torch.ones(2)
    view.all_reduce(t, op="avg")
    view.broadcast(t, src=1)
    view.broadcast(t, 0, [0, 1], True)
    view.send(t, 0)
    view.declare_groups([[0, 1]])
    view.put("grads", t)
    view.next_cid = 7  # a resumed node sets it through the strategy's comm
    assert comm.calls == [("all_reduce", "avg", [1, 4], False), ("broadcast", 4, [1, 4]),
                          ("broadcast", 1, [1, 4]), ("send", 1), ("declare", [[0, 3], [1, 4], [2, 5]]),
                          ("put", "stage1/grads")]
    assert comm.next_cid == 7
    with pytest.raises(ValueError, match=r"rank 2 is not a rank of this group's world \[0, 2\)"):
        view.send(t, 2)


def test_a_stage_without_replicas_exchanges_nothing():
    comm = _Comm(1)
    view = GroupView(comm, [1], [[0], [1], [2]], "stage1/")
    t = torch.arange(3.0)
    assert view.all_reduce(t) is t and view.broadcast(t, 0) is t
    assert torch.equal(view.all_gather(t, async_op=True).wait(), t.unsqueeze(0))
    assert comm.calls == []


# ---------------------------------------------------------------- what crosses a boundary
@pytest.mark.parametrize(("codec", "wire"), [
    (Quantized(4), 64 // 2 + 4 * (1 + 16)),  # 4 × 16 values at 4 bits, then the mean and 16 bin means
    (TopK(top_k=16, chunk=8, bits=None), 16 * 5 // 8 + 16 * 4),  # 2 tiles of 4 × 8 keep 8 each: 5-bit indices
    (LowRank(rank=4), 4 * 4 * 4),  # 4 rows × rank 4, fp32
])
def test_a_boundary_codec_sends_exactly_its_wire_bytes(codec, wire):
    coder = codec.coder(torch.Size([4, 16]))
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    buffer = coder.encode(x)
    assert buffer.dtype == torch.uint8 and buffer.numel() == coder.wire_nbytes == wire
    assert coder.decode(buffer, torch.float32).shape == x.shape


def test_what_each_codec_keeps():
    """16 bits keep a value to 2^-16 of the range; top-k of every entry keeps everything; the projection lifts
    back x·P·Pᵀ for its fixed basis P, the same on every rank."""
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    exact = TopK(top_k=64, chunk=8, bits=None).coder(x.shape)
    assert torch.equal(exact.decode(exact.encode(x), torch.float32), x)
    fine = Quantized(16).coder(x.shape)
    assert (fine.decode(fine.encode(x), torch.float32) - x).abs().max() < 1e-3
    a, b = LowRank(rank=4, seed=1).coder(x.shape), LowRank(rank=4, seed=1).coder(x.shape)
    assert torch.equal(a.basis, b.basis) and a.basis.shape == (16, 4)
    torch.testing.assert_close(b.decode(a.encode(x), torch.float32), x @ a.basis @ a.basis.T)


def test_a_codec_on_the_boundary_is_what_crosses_it():
    """Keeping every entry (top-k of all, fp32) trains exactly as no codec does; 8 bits send a quarter of the bytes
    and still train. Each message is the coder's wire bytes."""
    spec = PipelineSpec(stages=2, micro_batches=2, cuts=(1,))
    plain = fit(2, pipeline=spec)
    lossless = fit(2, pipeline=PipelineSpec(2, 2, cuts=(1,), codec=TopK(top_k=16, chunk=4, bits=None)))
    assert lossless.history["train_loss"] == pytest.approx(plain.history["train_loss"], rel=1e-6)
    quarter = fit(2, pipeline=PipelineSpec(2, 2, cuts=(1,), codec=Quantized(8)), max_steps=12)
    shape = torch.Size([KW["batch_size"] // 2, WIDTH])
    sizes = {e.nbytes for r in range(2) for e in quarter.trace.collectives(r) if e.op in ("send", "recv")}
    assert sizes == {Quantized(8).coder(shape).wire_nbytes} == {shape.numel() + 4 * 257}
    losses = quarter.history["train_loss"]
    assert sum(losses[-3:]) < sum(losses[:3])
    assert quarter.trace.meta["pipeline"]["codec"] == {"type": "Quantized", "bits": 8}


def test_a_pipeline_trains_on_the_simulated_clock_to_a_time_budget():
    """``max_sim_time_s``: the stages stop together at the step the online clock allows, and the clock's own
    replay reports the stages."""
    run = fit(2, pipeline=PipelineSpec(2, 2), max_steps=50, scenario="cross-region", max_sim_time_s=1.0)
    steps = len(run.history["train_loss"])
    assert 1 < steps < 50 and run.trace.num_steps(0) == run.trace.num_steps(1) == steps
    assert run.sim.stages == 2 and len(run.sim.stage_utilization()) == 2
    assert run.sim.step_end_times[-2] < 1.0
