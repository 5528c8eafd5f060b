"""Checkpoints and resume (a killed run continues to exactly the uninterrupted result) and determinism."""

from __future__ import annotations

import json
from typing import Callable, NamedTuple

import pytest
import torch

from exonet import LocalTrainer, NodeFailure, TraceError
from exonet.rundir import load_run, run_status
from exonet.runtime.batches import epoch_indices
from exonet.runtime.checkpoint import node_file, read_node
from exonet.runtime.testing import FailingModel, write_checkpoint
from exonet.strategies import (
    AsyncDiLoCoStrategy,
    DDPStrategy,
    DecoupledDiLoCoStrategy,
    DeMoStrategy,
    DiLoCoStrategy,
    FedAvgStrategy,
    FedBuffStrategy,
    MuLoCoStrategy,
    NoLoCoStrategy,
    OptimSpec,
    SparseLoCoStrategy,
    SPARTADiLoCoStrategy,
    SPARTAStrategy,
    Strategy,
    StreamingDiLoCoStrategy,
)
from exonet.strategies.base import flatten, unflatten_into
from exonet.toy import synthetic_classification

DATA = synthetic_classification(128, dim=8, classes=4)  # 64 samples per node: 8 steps per epoch
VAL = synthetic_classification(32, dim=8, classes=4, train=False)
KW = dict(num_nodes=2, max_steps=12, batch_size=8, val_interval=3, val_size=16, seed=5, progress=False)


def strategy() -> DDPStrategy:
    return DDPStrategy(OptimSpec("adamw", lr=3e-3, weight_decay=0.01))


def healthy() -> FailingModel:
    return FailingModel(fail_rank=-1, fail_step=0)  # the same network, never failing


def signature(trace) -> list[list[tuple]]:
    """What must repeat exactly: event kinds, collective ids, ops, bytes, groups, FLOPs (not times)."""
    return [[(type(e).__name__, getattr(e, "cid", None), getattr(e, "op", None), getattr(e, "nbytes", None),
              getattr(e, "group", None), getattr(e, "async_op", None), getattr(e, "flops", None)) for e in evs]
            for evs in trace.events]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Two uninterrupted runs with the same seed (the first with a run directory, no checkpoints)."""
    root = tmp_path_factory.mktemp("reference")
    return [LocalTrainer(healthy(), DATA, VAL).fit(strategy(), run_dir=root if i == 0 else None, **KW)
            for i in range(2)]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A run killed by SIGKILL at step 7 after its checkpoint at step 4, then resumed."""
    root = tmp_path_factory.mktemp("killed")
    killer = FailingModel(fail_rank=1, fail_step=8, how="kill")  # forward call 1 counts FLOPs: call 8 is step 7
    with pytest.raises(NodeFailure, match="SIGKILL") as info:
        LocalTrainer(killer, DATA, VAL).fit(strategy(), checkpoint_interval=4, run_dir=root, **KW)
    assert info.value.rank == 1
    (run,) = root.iterdir()
    after_kill = {
        "files": sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()),
        "latest": json.loads((run / "checkpoints" / "latest.json").read_text()),
        "status": run_status(run),
        "history": load_run(run)[1],
    }
    result = LocalTrainer(healthy(), DATA, VAL).fit(strategy(), resume_from=run, checkpoint_interval=4, **KW)
    return run, after_kill, result


def test_killed_run_keeps_its_last_committed_checkpoint(resumed):
    _, after_kill, _ = resumed
    latest = after_kill["latest"]
    assert {k: latest[k] for k in ("step", "dir")} == {"step": 4, "dir": "step-00000004"}
    # each rank's first loss, which a resumed run's divergence watch measures against (its mean: step 0's loss)
    assert sorted(latest["references"]) == ["0", "1"]
    assert sum(latest["references"].values()) / 2 == pytest.approx(after_kill["history"]["train_loss"][0], rel=1e-6)
    assert after_kill["files"] == sorted([
        "config.json", "metrics.jsonl", "trace.jsonl", "status.json", "checkpoints/latest.json",
        "checkpoints/step-00000004/node-0.pt", "checkpoints/step-00000004/node-1.pt",
        "checkpoints/step-00000004/metrics.jsonl", "checkpoints/step-00000004/trace.jsonl"])
    assert after_kill["status"]["complete"] is False
    assert 4 <= len(after_kill["history"]["train_loss"]) < 7


def test_resume_matches_the_uninterrupted_run_exactly(reference, resumed):
    want = reference[0]
    _, _, got = resumed
    for (name, a), b in zip(want.model.named_parameters(), got.model.parameters()):
        assert torch.equal(a, b), name
    assert got.history["train_loss"] == want.history["train_loss"]
    assert got.history["eval"] == want.history["eval"]
    assert signature(got.trace) == signature(want.trace)
    for rank in range(2):  # collective ids continue after the checkpoint's, so they stay unique
        assert [c.cid for c in got.trace.collectives(rank)] == list(range(12))


def test_resumed_run_finishes_in_its_own_directory(resumed):
    run, _, result = resumed
    assert result.run_dir == run and run_status(run)["complete"] is True
    _, history, trace = load_run(run)
    assert history["train_loss"] == result.history["train_loss"] and trace.num_steps(1) == 12
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 8
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest.json", "step-00000008"]


def test_resume_with_other_settings_is_refused(resumed):
    run, _, _ = resumed
    with pytest.raises(ValueError, match=r"resume_from: .*seed: the run had 5, this fit has 6"):
        LocalTrainer(healthy(), DATA, VAL).fit(strategy(), resume_from=run, **{**KW, "seed": 6})
    # a nested difference is named down to its leaf (both strategy dicts, 700 characters, were printed)
    with pytest.raises(ValueError, match=r"\(strategy.optim_spec.lr: the run had 0.003, this fit has 0.05\); resume"):
        LocalTrainer(healthy(), DATA, VAL).fit(DDPStrategy(OptimSpec("adamw", lr=0.05, weight_decay=0.01)),
                                               resume_from=run, **KW)


def test_a_resumed_runs_time_counts_the_run_it_continues(resumed):
    """The resumed part alone was reported: 378 ms for a run whose uninterrupted time was 4.54 s."""
    _, after_kill, result = resumed
    assert result.real_time_s > after_kill["status"]["real_time_s"] > 0
    assert run_status(result.run_dir)["real_time_s"] == result.real_time_s


class _Wrapped(torch.nn.Module):
    """The same network one level down: its state_dict keys differ from the checkpoint's."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = healthy()

    def forward(self, batch):
        return self.inner(batch)


def test_a_resume_that_fails_before_adding_a_step_leaves_the_run_as_it_was(resumed):
    """A finished run resumed with the wrong model failed in its nodes after the folder was reopened, and
    its 12 steps were overwritten by the checkpoint's 8, marked incomplete: now the run stays whole."""
    run, _, result = resumed
    status, history = run_status(run), load_run(run)[1]
    assert status["complete"] and len(history["train_loss"]) == KW["max_steps"]
    with pytest.raises(NodeFailure, match="state_dict"):
        LocalTrainer(_Wrapped(), DATA, VAL).fit(strategy(), resume_from=run, checkpoint_interval=4, **KW)
    assert run_status(run) == status and load_run(run)[1] == history


def test_an_edited_or_corrupt_checkpoint_is_named(resumed, tmp_path):
    """latest.json pointing at another step trained on (to 33 of 20 steps); a truncated node file failed
    with torch's "failed reading zip archive", naming no file (now the parent refuses it before any node starts)."""
    import shutil

    run = shutil.copytree(resumed[0], tmp_path / "run")
    latest = run / "checkpoints" / "latest.json"
    record = json.loads(latest.read_text())
    latest.write_text(json.dumps({**record, "step": 5}))
    with pytest.raises(TraceError, match=rf"latest.json: says step 5, but {record['dir']} holds 8 steps"):
        LocalTrainer(healthy(), DATA, VAL).fit(strategy(), resume_from=run, checkpoint_interval=4, **KW)
    latest.write_text(json.dumps(record))
    node = run / "checkpoints" / record["dir"] / "node-1.pt"
    node.write_bytes(node.read_bytes()[:100])
    with pytest.raises(TraceError, match=r"node-1.pt: cannot read the checkpoint \(PytorchStreamReader failed reading "
                       r"zip archive: failed finding central directory\)$"):
        LocalTrainer(healthy(), DATA, VAL).fit(strategy(), resume_from=run, checkpoint_interval=4, **KW)


def test_resume_from_a_run_without_checkpoints_is_refused(reference):
    with pytest.raises(TraceError, match=r"latest.json is missing"):
        LocalTrainer(healthy(), DATA, VAL).fit(strategy(), resume_from=reference[0].run_dir, **KW)


def test_same_seed_gives_identical_curves_and_traces(reference):
    a, b = reference
    assert a.history["train_loss"] == b.history["train_loss"]
    assert a.history["eval"] == b.history["eval"]
    assert signature(a.trace) == signature(b.trace)
    for x, y in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("shared", [True, False])
def test_data_order_is_a_pure_function_of_seed_rank_and_epoch(shared):
    def order(seed: int, rank: int = 0, epoch: int = 0) -> list[int]:
        return epoch_indices(100, rank, 2, seed, epoch, shuffle=True, shared=shared)

    assert order(0) == order(0) and order(0, 1, 3) == order(0, 1, 3)
    assert order(0) != order(1)  # different seeds, different data order
    assert order(0, epoch=0) != order(0, epoch=1)
    if shared:  # one dataset dealt across nodes: disjoint shards, DistributedSampler's order
        assert not set(order(0, 0)) & set(order(0, 1)) and len(order(0)) == 50
        assert epoch_indices(10, 1, 2, 0, 0, shuffle=False, shared=True) == [1, 3, 5, 7, 9]
    else:  # a factory's own shard: each rank shuffles its own
        assert sorted(order(0)) == list(range(100)) and order(0, 0) != order(0, 1)


@pytest.mark.slow
def test_demo_resumes_exactly_from_its_checkpointed_dct_momentum(tmp_path):
    def demo() -> DeMoStrategy:
        return DeMoStrategy(OptimSpec("sgd", lr=1e-3), compression_topk=4, compression_chunk=8)

    kw = dict(KW, max_steps=6, val_interval=0)
    whole = LocalTrainer(healthy(), DATA).fit(demo(), checkpoint_interval=3, run_dir=tmp_path, **kw)
    (run,) = tmp_path.iterdir()
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 3
    state = read_node(node_file(run / "checkpoints" / "step-00000003", 0))["strategy"]
    assert state["momentum"]  # the DCT coefficients of the momentum travel in the checkpoint
    again = LocalTrainer(healthy(), DATA).fit(demo(), resume_from=run, checkpoint_interval=3, **kw)  # from step 3
    for a, b in zip(whole.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)
    assert again.history["train_loss"] == whole.history["train_loss"]


def test_a_resumed_run_judges_divergence_against_the_first_losses_of_the_run_it_continues(tmp_path):
    from exonet.errors import DivergenceError
    from exonet.runtime.checkpoint import load_latest
    from exonet.runtime.divergence import DivergenceWatch

    watch = DivergenceWatch()
    watch.restore({0: 2.3, 1: 2.2})  # the untrained losses; the resumed run first reports a trained 0.06
    watch.check(0, 101, 0.06)
    watch.check(0, 108, 0.82)  # over 10x 0.06, far under 10x 2.3: a healthy run's spike
    with pytest.raises(DivergenceError, match="over 10x its first \\(2.3\\)"):
        watch.check(0, 109, 23.5)
    run = write_checkpoint(tmp_path / "kept", references={0: 2.3, 1: 2.2})
    assert load_latest(run, 2).references == {0: 2.3, 1: 2.2}
    run = write_checkpoint(tmp_path / "older")  # as a checkpoint written before references were kept
    assert load_latest(run, 2).references == {0: 1.0, 1: 1.0}  # the first step's mean loss


# ------------------------------------------------------------------ every strategy resumes exactly, or is refused
def _streaming(**kw) -> StreamingDiLoCoStrategy:
    return StreamingDiLoCoStrategy(OptimSpec("adamw", lr=3e-3), H=4, num_fragments=2, **kw)


class Case(NamedTuple):
    """A strategy resumed mid-flight: its nodes, the checkpoint interval of its fit (steps 1-8; the checkpoint
    resumed is its last: 6 for 3), what is in flight at that checkpoint, and more fit arguments."""

    make: Callable[[], Strategy]
    nodes: int = 2
    every: int = 3
    in_flight: str | None = None
    fit: dict = {}


RESUMED = {
    "ddp": Case(lambda: DDPStrategy(OptimSpec("adamw", lr=3e-3), overlap=False)),
    "ddp-overlap": Case(lambda: DDPStrategy(OptimSpec("adamw", lr=3e-3), bucket_cap_mb=1e-4)),
    "fedavg": Case(lambda: FedAvgStrategy(OptimSpec("adamw", lr=3e-3), H=4)),
    "diloco": Case(lambda: DiLoCoStrategy(OptimSpec("adamw", lr=3e-3), H=4, lr_scheduler="cosine", warmup_steps=2)),
    # the clock replays the run it continues: the waits after the resume name collectives issued before it
    "sparta": Case(lambda: SPARTAStrategy(OptimSpec("adamw", lr=3e-3), p_sparta=0.1, delay_steps=3),
                   in_flight="the exchanges of steps 4, 5 and 6", fit={"scenario": "datacenter"}),
    "demo": Case(lambda: DeMoStrategy(OptimSpec("sgd", lr=1e-3), compression_topk=4, compression_chunk=8)),
    "sparta_diloco": Case(lambda: SPARTADiLoCoStrategy(OptimSpec("adamw", lr=3e-3), p_sparta=0.1, H=4)),
    "streaming_diloco": Case(lambda: _streaming(delay_steps=1), in_flight="fragment 0's round, started at step 6"),
    "streaming_diloco-4bit": Case(lambda: _streaming(delay_steps=2, quantize_bits=4),
                                  in_flight="fragment 0's round, its all_to_all issued at step 6"),
    "streaming_diloco-4bit-phase2": Case(lambda: _streaming(delay_steps=2, quantize_bits=4), every=7,
                                         in_flight="fragment 0's round, its all_gather issued at step 7"),
    "streaming_diloco-replicas": Case(lambda: _streaming(delay_steps=2, replica_size=2), nodes=4,
                                      in_flight="fragment 0's round, its mean across workers started at step 6"),
    "diloco-eager": Case(lambda: DiLoCoStrategy(OptimSpec("adamw", lr=3e-3), H=4, overlap="eager"),
                         in_flight="round 1's all-reduce, started at step 4"),
    "diloco-2bit": Case(lambda: DiLoCoStrategy(OptimSpec("adamw", lr=3e-3), H=4, quantize_bits=2)),
    "sparseloco": Case(lambda: SparseLoCoStrategy(OptimSpec("adamw", lr=3e-3), H=4, top_k=8, chunk=4)),
    "muloco": Case(lambda: MuLoCoStrategy(H=4, quantize_bits=2)),
    "noloco": Case(lambda: NoLoCoStrategy(OptimSpec("adamw", lr=3e-3), H=4)),
}
# Asynchronous strategies (the simulated clock decides who syncs when) refuse checkpoints and resume, saying so.
REFUSED = {
    "async_diloco": lambda: AsyncDiLoCoStrategy(H=2),
    "fedbuff": lambda: FedBuffStrategy(H=2),
    "fedavg-deadline": lambda: FedAvgStrategy(H=2, deadline_s=1.0),
    "ddp-elastic": lambda: DDPStrategy(elastic=True),
    "decoupled_diloco": lambda: DecoupledDiLoCoStrategy(H=2, num_fragments=2),
}
MATRIX = dict(KW, max_steps=8)


def test_the_resume_matrix_covers_every_strategy_exonet_ships():
    """The names of exonet.strategies.__all__: AllReduce and SimpleReduce are DDP, the rest are resumed
    below, or refused."""
    import exonet.strategies as shipped

    classes = {getattr(shipped, name) for name in shipped.__all__
               if isinstance(getattr(shipped, name), type) and issubclass(getattr(shipped, name), Strategy)}
    classes.discard(Strategy)
    assert shipped.AllReduceStrategy is shipped.SimpleReduceStrategy is DDPStrategy
    covered = {type(make()) for make, *_ in RESUMED.values()} | {type(make()) for make in REFUSED.values()}
    assert classes == covered


@pytest.mark.parametrize("name", RESUMED)
def test_every_strategy_resumed_mid_flight_ends_as_the_uninterrupted_run(tmp_path, name):
    """SPARTA with delay_steps=3 ended with another model (its exchanges in flight were not saved); a resumed
    Streaming DiLoCo (delay 2, 4-bit) issued its pending round again: 9% more bytes (952 B against 816 B here)."""
    case = RESUMED[name]
    kw = dict(MATRIX, num_nodes=case.nodes, **case.fit)
    plain = LocalTrainer(healthy(), DATA, VAL).fit(case.make(), **kw)
    whole = LocalTrainer(healthy(), DATA, VAL).fit(case.make(), checkpoint_interval=case.every, run_dir=tmp_path, **kw)
    (run,) = tmp_path.iterdir()
    step = json.loads((run / "checkpoints" / "latest.json").read_text())["step"]
    assert step == (6 if case.every == 3 else case.every)
    state = read_node(node_file(run / "checkpoints" / f"step-{step:08d}", 0))["strategy"]
    assert bool(state.get("in_flight")) == (case.in_flight is not None), case.in_flight  # what a resume carries over
    again = LocalTrainer(healthy(), DATA, VAL).fit(case.make(), resume_from=run, checkpoint_interval=case.every, **kw)
    for got in (whole, again):  # checkpoints change nothing; a resume ends where the uninterrupted run ends
        for (where, a), b in zip(plain.model.named_parameters(), got.model.parameters()):
            assert torch.equal(a, b), where
        assert got.history["train_loss"] == plain.history["train_loss"]
        assert got.history["eval"] == plain.history["eval"]
        assert signature(got.trace) == signature(plain.trace)
        assert [got.payload_bytes(r) for r in range(case.nodes)] == [plain.payload_bytes(r) for r in range(case.nodes)]


@pytest.mark.parametrize("name", REFUSED)
def test_an_asynchronous_strategy_refuses_checkpoints_and_resume(tmp_path, name):
    with pytest.raises(ValueError, match=r"\(asynchronous\) needs count_flops=True and cannot checkpoint or resume"):
        LocalTrainer(healthy(), DATA, VAL).fit(REFUSED[name](), checkpoint_interval=3, run_dir=tmp_path,
                                               scenario="datacenter", **MATRIX)


class _ForgetsItsExchange(Strategy):
    """Averages the parameters asynchronously and applies the average a step later, as SPARTA with a delay
    does; but its state_dict does not keep the average in flight, so a resume could not end as the run would."""

    def setup(self, model, comm, ctx) -> None:
        super().setup(model, comm, ctx)
        self._sent = self._pending = None

    def step(self) -> None:
        self.optimizer_step()
        self.finish()
        self._sent = flatten(self.params)
        self._pending = self.comm.all_reduce(self._sent.clone(), op="avg", async_op=True)

    def finish(self) -> None:
        if self._pending is not None:
            with torch.no_grad():
                unflatten_into(flatten(self.params) + self._pending.wait() - self._sent, self.params)
            self._pending = None


def test_a_checkpoint_that_would_lose_an_exchange_in_flight_is_refused(tmp_path):
    """A strategy's own exchange in flight was left out of its checkpoint silently: the resumed run ended elsewhere."""
    with pytest.raises(NodeFailure, match=r"checkpoint: _ForgetsItsExchange.state_dict\(\) does not keep the "
                                          r"collective\(s\) 2 still in flight after step 3: a resume would lose them"):
        LocalTrainer(healthy(), DATA, VAL).fit(_ForgetsItsExchange(), checkpoint_interval=3, run_dir=tmp_path,
                                               **MATRIX)
