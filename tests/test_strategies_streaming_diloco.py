"""Streaming DiLoCo: fragments and schedule, quantized transfer, equivalence with DiLoCo, bytes and overlap."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exonet import LocalTrainer
from exonet.communicator import Communicator
from exonet.runtime.batches import validation_sample
from exonet.strategies.base import NodeContext, OptimSpec
from exonet.strategies.diloco import DiLoCoStrategy
from exonet.strategies.quantize import BLOCK, pack, packed_nbytes, padded_length, unpack
from exonet.strategies.streaming_diloco import StreamingDiLoCoStrategy, fragment_bounds, fragment_offsets
from exonet.toy import Regressor, linear_regressor, synthetic_classification, synthetic_regression, tiny_mlp
from exonet.trace import Collective, Step, Wait

K = 2


# ------------------------------------------------------------------ pure functions
@pytest.mark.parametrize("sizes, f, want", [
    ([10, 10, 10, 10], 2, [(0, 2), (2, 4)]),
    ([10, 10, 10, 10], 1, [(0, 4)]),
    ([1000, 1000, 1, 1], 3, [(0, 1), (1, 2), (2, 4)]),
    ([5, 100, 5], 2, [(0, 1), (1, 3)]),            # tie between boundaries 1 and 2: the earlier wins
    ([3, 3, 3], 3, [(0, 1), (1, 2), (2, 3)]),
])
def test_fragments_are_contiguous_and_about_equal(sizes, f, want):
    assert [(r.start, r.stop) for r in fragment_bounds(sizes, f)] == want


def test_more_fragments_than_tensors_is_an_error():
    with pytest.raises(ValueError, match="num_fragments"):
        fragment_bounds([4, 4], 3)


@pytest.mark.parametrize("H, f, want", [(5, 1, [5]), (8, 4, [2, 4, 6, 8]), (10, 3, [3, 6, 10]), (4, 2, [2, 4])])
def test_fragment_offsets_stagger_by_H_over_F(H, f, want):
    assert fragment_offsets(H, f) == want


@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_round_trip_error_is_at_most_half_a_step_per_block(bits):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6 * BLOCK, generator=g) * torch.tensor([1e-6, 1e-2, 1.0, 30.0, 0.0, 1.0]).repeat_interleave(BLOCK)
    qmax = 2 ** (bits - 1) - 1
    buf = pack(x, bits)
    assert buf.dtype == torch.uint8 and buf.numel() == packed_nbytes(x.numel(), bits) == x.numel() * bits // 8 + 6 * 4
    y = unpack(buf, bits)
    step = x.view(-1, BLOCK).abs().amax(1, keepdim=True) / qmax
    assert ((y - x).view(-1, BLOCK).abs() <= step / 2 * (1 + 1e-5)).all()
    assert (y[4 * BLOCK:5 * BLOCK] == 0).all()                         # an all-zero block stays zero
    big = x.abs() > step.repeat_interleave(BLOCK, 0).view(-1) / 2
    assert torch.equal(torch.sign(y[big]), torch.sign(x[big]))          # negative values keep their sign


@pytest.mark.parametrize("bits", [4, 8])
def test_values_on_the_grid_survive_exactly(bits):
    qmax = 2 ** (bits - 1) - 1
    codes = torch.arange(-qmax, qmax + 1, dtype=torch.float32).repeat(BLOCK)[:BLOCK]
    codes[0] = qmax
    x = codes * 0.25
    assert torch.equal(unpack(pack(x, bits), bits), x)


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="quantize_bits"):
        pack(torch.zeros(BLOCK), 3)
    with pytest.raises(ValueError, match="blocks"):
        pack(torch.zeros(BLOCK + 1), 4)


def test_padded_length_splits_into_whole_blocks_per_node():
    assert padded_length(1, 2) == 2 * BLOCK
    assert padded_length(2 * BLOCK, 2) == 2 * BLOCK
    assert padded_length(2 * BLOCK + 1, 2) == 4 * BLOCK


@pytest.mark.parametrize("kwargs, name, error", [
    ({"H": 0}, "H", ValueError), ({"num_fragments": 0}, "num_fragments", ValueError),
    ({"H": 4, "num_fragments": 5}, r"num_fragments must be <= H = 4 .*got 5", ValueError),
    ({"delay_steps": -1}, "delay_steps", ValueError),
    ({"H": 4, "delay_steps": 5}, r"delay_steps must be <= H = 4 .*got 5", ValueError),
    ({"quantize_bits": 2}, "quantize_bits", ValueError),
    ({"quantize_bits": True}, "quantize_bits", ValueError), ({"merge_alpha": 1.5}, "merge_alpha", ValueError),
    ({"optim_spec": "nope"}, "optim_spec", ValueError), ({"outer_optim_spec": "nope"}, "outer_optim_spec", ValueError),
    ({"H": 2.5}, "H", TypeError),
])
def test_bad_arguments_fail_at_construction_naming_the_argument(kwargs, name, error):
    with pytest.raises(error, match=name):
        StreamingDiLoCoStrategy(**kwargs)


def test_merge_and_outer_step_on_one_node_by_hand():
    """K = 1 (no collectives): H = 2, τ = 1, α = 0.25, inner SGD lr 0.1, outer SGD lr 0.7 without momentum."""
    torch.manual_seed(0)
    model = linear_regressor()
    data = synthetic_regression(n=8)
    strategy = StreamingDiLoCoStrategy(OptimSpec("sgd", lr=0.1), outer_optim_spec=OptimSpec("sgd", lr=0.7), H=2,
                                       num_fragments=1, delay_steps=1, merge_alpha=0.25)
    strategy.setup(model, Communicator(0, 1, torch.device("cpu")), NodeContext(0, 1, 3, 0, torch.device("cpu")))

    def flat() -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()

    def inner(i: int) -> None:
        strategy.zero_grad()
        model(data[i * 4:(i + 1) * 4]).backward()

    theta0 = flat()
    after = []
    for i in range(3):
        inner(i % 2)
        strategy.step()
        after.append(flat())
    theta2 = after[1]                                          # step 2 starts the sync; nothing changes yet
    local3 = theta2 - 0.1 * _grad_at(model, theta2, data[0:4])  # step 3's inner SGD step from θ_2
    theta_global = theta0 - 0.7 * (theta0 - theta2)
    assert torch.allclose(after[2], 0.75 * theta_global + 0.25 * local3, atol=1e-6)


def _grad_at(model: nn.Module, flat: torch.Tensor, batch) -> torch.Tensor:
    probe = linear_regressor()
    torch.nn.utils.vector_to_parameters(flat, probe.parameters())
    probe(batch).backward()
    return torch.cat([p.grad.reshape(-1) for p in probe.parameters()])


# --------------------------------------------------------------- real processes
def fit(model: nn.Module, data, strategy, steps: int):
    return LocalTrainer(model, data).fit(strategy, num_nodes=K, max_steps=steps, batch_size=8, shuffle=False,
                                         progress=False)


@pytest.fixture(scope="module")
def small_data():
    return synthetic_classification(n=256, dim=8, classes=4)


@pytest.fixture(scope="module")
def diloco_run(small_data):
    return fit(tiny_mlp(), small_data, DiLoCoStrategy(H=3), 6)


@pytest.fixture(scope="module")
def streaming_f1_run(small_data):
    return fit(tiny_mlp(), small_data, StreamingDiLoCoStrategy(H=3, num_fragments=1, delay_steps=0, merge_alpha=0.0), 6)


def test_f1_tau0_alpha0_equals_diloco(diloco_run, streaming_f1_run):
    for (name, a), b in zip(diloco_run.model.named_parameters(), streaming_f1_run.model.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), name
    assert streaming_f1_run.history["train_loss"] == pytest.approx(diloco_run.history["train_loss"], abs=1e-6)
    assert streaming_f1_run.payload_bytes(0) == diloco_run.payload_bytes(0)


def test_tau0_waits_in_the_step_it_starts(streaming_f1_run):
    starts, waits = _steps_of_collectives_and_waits(streaming_f1_run.trace.events[0])
    assert sorted(starts.values()) == [2, 5]                       # 0-based step index: after inner steps 3 and 6
    assert all(waits[cid] == starts[cid] for cid in starts)


def test_8bit_transfer_stays_close_to_exact(small_data, streaming_f1_run):
    run = fit(tiny_mlp(), small_data,
              StreamingDiLoCoStrategy(H=3, num_fragments=1, delay_steps=0, merge_alpha=0.0, quantize_bits=8), 6)
    exact = torch.cat([p.reshape(-1) for p in streaming_f1_run.model.parameters()])
    quant = torch.cat([p.reshape(-1) for p in run.model.parameters()])
    moved = (exact - torch.cat([p.reshape(-1) for p in tiny_mlp().parameters()])).abs().max()
    assert 0 < (quant - exact).abs().max() < 0.05 * moved


@pytest.fixture(scope="module")
def overlapped_run(small_data):
    strategy = StreamingDiLoCoStrategy(H=4, num_fragments=2, delay_steps=2, merge_alpha=0.5)
    return LocalTrainer(tiny_mlp(), small_data, small_data).fit(
        strategy, num_nodes=K, max_steps=8, batch_size=8, shuffle=False, progress=False, val_interval=4, val_size=64)


def test_the_last_evaluation_is_of_the_returned_model_after_the_sync_in_flight(overlapped_run, small_data):
    """Fragment 1's sync after step 8 lands in finish(): the final evaluation came before it, so
    history's last loss was of another model than the one fit returned."""
    assert [e["step"] for e in overlapped_run.history["eval"]] == [0, 4, 8]
    rows = torch.utils.data.default_collate([small_data[i] for i in validation_sample(len(small_data), 64, 0)])
    with torch.no_grad():
        returned = float(overlapped_run.model.eval()(rows))
    assert overlapped_run.history["eval"][-1]["loss"] == pytest.approx(returned, rel=1e-5)


def test_overlap_shows_in_the_trace_wait_tau_steps_later(overlapped_run):
    for rank in range(K):
        events = overlapped_run.trace.events[rank]
        starts, waits = _steps_of_collectives_and_waits(events)
        assert all(c.async_op and c.op == "all_reduce" for c in overlapped_run.trace.collectives(rank))
        assert sorted(starts.values()) == [1, 3, 5, 7]             # fragment 0 after steps 2, 6; fragment 1 after 4, 8
        last = sum(isinstance(e, Step) for e in events)
        for cid, step in starts.items():
            assert waits[cid] == (step + 2 if step + 2 < last else last)   # the last one completes in finish()


def test_overlapped_fragments_send_4P_per_H_steps(overlapped_run):
    params = sum(p.numel() for p in tiny_mlp().parameters())
    assert overlapped_run.payload_bytes(0) == 2 * 4 * params          # 8 steps = 2 rounds of every fragment


@pytest.fixture(scope="module")
def four_bit_run():
    torch.manual_seed(0)
    model = Regressor(nn.Sequential(nn.Linear(256, 256, bias=False), nn.Tanh(), nn.Linear(256, 256, bias=False)))
    strategy = StreamingDiLoCoStrategy(H=4, num_fragments=2, delay_steps=2, quantize_bits=4)
    return fit(model, synthetic_regression(n=64, in_dim=256, out_dim=256), strategy, 8), 2 * 256 * 256


def test_4bit_payload_is_about_P_over_2_per_H_steps_plus_scales(four_bit_run):
    run, params = four_bit_run
    fragment = params // 2                                      # 65536 values: no padding for K = 2, BLOCK = 128
    quantized = packed_nbytes(fragment, 4)                      # P_f/2 codes + 4 bytes per block
    # Counted payload per fragment sync: the all_to_all's full input (K chunks) plus one all_gather chunk.
    per_sync = quantized + quantized // K
    assert run.payload_bytes(0) == 2 * 2 * per_sync             # 2 fragments, 2 rounds each
    # On the wire each node sends (K-1)/K of the all_to_all and K-1 all_gather chunks: 2(K-1)/K of the size.
    wire_per_H = sum(c.nbytes * ((K - 1) / K if c.op == "all_to_all" else K - 1)
                     for c in run.trace.collectives(0)) / 2
    assert params / 2 <= wire_per_H * K / (2 * (K - 1)) <= params / 2 * (1 + 8 / BLOCK)
    assert torch.isfinite(torch.tensor(run.history["train_loss"])).all()


@pytest.mark.parametrize("bits", [None, pytest.param(4, marks=pytest.mark.slow)])
def test_resuming_from_a_checkpoint_with_a_sync_in_flight_changes_nothing(tmp_path, small_data, bits):
    def strategy() -> StreamingDiLoCoStrategy:
        return StreamingDiLoCoStrategy(H=4, num_fragments=2, delay_steps=2, quantize_bits=bits)

    trainer = LocalTrainer(tiny_mlp(), small_data)
    kwargs = dict(num_nodes=K, max_steps=8, batch_size=8, shuffle=False, progress=False)
    whole = trainer.fit(strategy(), **kwargs, run_dir=tmp_path / "run", checkpoint_interval=6)
    resumed = trainer.fit(strategy(), **kwargs, resume_from=whole.run_dir)   # from step 6: fragment 0 in flight
    for (name, a), b in zip(whole.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), name


def test_4bit_phases_overlap_compute(four_bit_run):
    run, _ = four_bit_run
    events = run.trace.events[0]
    starts, waits = _steps_of_collectives_and_waits(events)
    ops = {c.cid: c.op for c in run.trace.collectives(0)}
    last = sum(isinstance(e, Step) for e in events)
    for cid, step in starts.items():
        if ops[cid] == "all_to_all":                            # phase 1: started at the sync, received one step later
            assert step in (1, 3, 5, 7) and waits[cid] == min(step + 1, last)
        else:                                                   # phase 2: started then, needed at the sync + τ
            assert step in (2, 4, 6, 8) and waits[cid] == min(step + 1, last)


def _steps_of_collectives_and_waits(events) -> tuple[dict[int, int], dict[int, int]]:
    """For each collective id: the (0-based) step in which it was issued and in which it was waited on."""
    step, starts, waits = 0, {}, {}
    for e in events:
        if isinstance(e, Collective):
            starts[e.cid] = step
        elif isinstance(e, Wait):
            waits[e.cid] = step
        elif isinstance(e, Step):
            step += 1
    return starts, waits
