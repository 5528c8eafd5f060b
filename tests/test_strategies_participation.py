"""DiLoCo under partial participation keeps every round's members identical; rounds of one are refused.

K = 3, participation 0.6 (two nodes a round). A node that sits a round out must not keep a stale
θ_global and outer momentum (two participants would then differ right after a sync, by 0.018,
0.124, ... with ‖θ‖ ≈ 2.6): the nodes of each round start it from the current global state,
handed to newcomers by one broadcast, so the distance is 0 after every sync. Nodes are real processes;
a node's state right after a sync is read from the checkpoint written at that step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from exonet import LocalTrainer
from exonet.communicator import Communicator
from exonet.runtime.checkpoint import node_file, read_node
from exonet.strategies.base import NodeContext, OptimSpec, flatten
from exonet.strategies.diloco import DiLoCoStrategy
from exonet.strategies.fedavg import FedAvgStrategy
from exonet.strategies.sparta_diloco import SPARTADiLoCoStrategy
from exonet.toy import synthetic_classification, tiny_mlp

K, H, PARTICIPATION = 3, 2, 0.6
P = sum(p.numel() for p in tiny_mlp().parameters())  # 212 fp32 parameters
ADAMW = OptimSpec("adamw", lr=0.01)


def diloco() -> DiLoCoStrategy:
    return DiLoCoStrategy(ADAMW, H=H, participation=PARTICIPATION)  # the paper's Nesterov outer step


def bound(strategy, rank: int = 0, num_nodes: int = K, max_steps: int = 100):
    strategy.setup(tiny_mlp(), Communicator(rank, num_nodes, torch.device("cpu")),
                   NodeContext(rank, num_nodes, max_steps, 0, torch.device("cpu")))
    return strategy


def states_after_sync(tmp_path: Path, rounds: int):
    """Every node's (parameters, θ_global, outer momentum) right after sync number ``rounds``, and the fit."""
    step = rounds * H
    run_dir = tmp_path / f"r{rounds}"
    result = LocalTrainer(tiny_mlp(), synthetic_classification(256, 8, 4)).fit(
        diloco(), num_nodes=K, max_steps=step + 1, batch_size=16, seed=0, progress=False, run_dir=run_dir,
        checkpoint_interval=H)  # no checkpoint at the last step: step + 1 leaves the one at `step` committed
    (run,) = run_dir.iterdir()
    folder = run / "checkpoints" / f"step-{step:08d}"
    states = []
    for r in range(K):
        node = read_node(node_file(folder, r))
        outer = node["strategy"]["outer_optimizer"]["state"]
        states.append((flatten(node["model"].values()), node["strategy"]["global_params"],
                       outer[0]["momentum_buffer"] if outer else None))
    return states, result


def participants(round_index: int) -> tuple[int, ...]:
    (group,) = bound(diloco()).round_partition(round_index)
    return group


def assert_identical_after_sync(tmp_path: Path, rounds: int):
    states, result = states_after_sync(tmp_path, rounds)
    a, b = (states[r] for r in participants(rounds))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert torch.equal(a[0], a[1])                      # the sync restarted them from θ_global
    return result


def test_participants_are_identical_right_after_a_sync_and_newcomers_are_handed_the_state(tmp_path):
    # sync 4 (step 8): rank 0 sat rounds 1-2 out and took part in rounds 3-4 (a stale state gives distance 0.19)
    assert [participants(i) for i in range(1, 6)] == [(1, 2), (1, 2), (0, 2), (0, 2), (1, 2)]
    result = assert_identical_after_sync(tmp_path, 4)
    # the hand-off: after round 2, rank 1 (lowest of (1, 2)) sends θ_global + momentum (2·4P bytes) to newcomer 0;
    # none after round 1 (no newcomer) nor after round 4 (round 5 would end at step 10, past max_steps = 9)
    handoff = 2 * 4 * P
    assert result.payload_bytes_per_step(0) == [0, 0, 0, handoff, 0, 4 * P, 0, 4 * P, 0]
    assert result.payload_bytes_per_step(1) == [0, 4 * P, 0, 4 * P + handoff, 0, 0, 0, 0, 0]
    assert [(c.op, c.group) for c in result.trace.collectives(0)] == [
        ("broadcast", (0, 1)), ("all_reduce", (0, 2)), ("all_reduce", (0, 2))]


@pytest.mark.slow
@pytest.mark.parametrize("rounds", range(1, 7))
def test_participants_are_at_distance_zero_after_every_sync(tmp_path, rounds):
    assert_identical_after_sync(tmp_path, rounds)


def test_no_hand_off_is_planned_past_the_last_round_or_at_full_participation():
    groups = []

    class Recorder(Communicator):
        def declare_groups(self, gs):
            groups.extend(tuple(g) for g in gs)

    node = DiLoCoStrategy(ADAMW, H=H, participation=PARTICIPATION)
    node.setup(tiny_mlp(), Recorder(0, K, torch.device("cpu")), NodeContext(0, K, 4, 0, torch.device("cpu")))
    node.hand_off(2)                                     # round 3 would end at step 6 > max_steps = 4
    node.hand_off(1)                                     # round 2 has no newcomer
    assert groups == []
    full = DiLoCoStrategy(ADAMW, H=H)
    full.setup(tiny_mlp(), Recorder(0, K, torch.device("cpu")), NodeContext(0, K, 100, 0, torch.device("cpu")))
    full.hand_off(1)
    assert groups == []


@pytest.mark.parametrize("outer, size", [(None, 2 * P), (OptimSpec("adam", lr=0.1, weight_decay=0.1), 3 * P + 1)])
def test_a_node_that_never_stepped_adopts_the_outer_state_of_one_that_did(outer, size):
    donor, newcomer = (bound(DiLoCoStrategy(ADAMW, outer_optim_spec=outer, H=H, participation=PARTICIPATION), r)
                       for r in (1, 0))
    with torch.no_grad():
        for _ in range(2):
            donor.global_params.grad = torch.randn_like(donor.global_params)
            donor.outer_optimizer.step()                 # the outer state now exists on the donor only
        donor.global_params.grad = None
        buffer = donor._global_state()
        assert buffer.numel() == size                    # θ_global + momentum; Adam: + two moments + step
        newcomer._global_state()                         # what the broadcast receives into: same size
        newcomer._load_global_state(buffer.clone())
    assert torch.equal(newcomer.global_params, donor.global_params)
    mine, theirs = (s.outer_optimizer.state[s.global_params] for s in (newcomer, donor))
    assert mine.keys() == theirs.keys() and all(torch.equal(torch.as_tensor(mine[k]), torch.as_tensor(theirs[k]))
                                                for k in mine)


@pytest.mark.parametrize("make", [FedAvgStrategy, DiLoCoStrategy, SPARTADiLoCoStrategy])
@pytest.mark.parametrize("participation, k", [(0.3, 3), (0.5, 2), (0.1, 10)])
def test_rounds_of_a_single_node_are_an_error_naming_participation_and_k(make, participation, k):
    with pytest.raises(ValueError, match=rf"participation={participation} with K={k} nodes.*1/K"):
        bound(make(participation=participation), 0, k)
    bound(make(participation=participation), 0, 1)      # K = 1: a round of one is all there is
    bound(make(participation=min(1.0, 2.0 / k)), 0, k)  # two a round: fine


# ------------------------------------------------------------------ DeMo's block reshapes
# The cut and the batched-matmul transform agree
# with the reference's formulation below (the einops pattern, written out) up to float
# rounding: two matmuls may contract in another order than einsum picks.
@pytest.mark.parametrize("shape", [(256, 256), (256,), (7,), (64, 3, 3, 3), (130, 96), (12, 10, 5)])
def test_demo_block_transform_agrees_with_the_reference_formulation(shape):
    from exonet.strategies import demo

    dct = demo.ChunkedDCT(shape, 64)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    a, h, b, w = dct.rows // dct.h, dct.h, dct.cols // dct.w, dct.w
    blocks = x.reshape(a, h, b, w)                           # "(a h) (b w) -> a h b w"
    coeffs = torch.einsum("ahbw,hi,wj->abij", blocks, dct.basis_h, dct.basis_w).reshape(a * b, h * w)
    torch.testing.assert_close(dct.encode(x), coeffs, rtol=0, atol=1e-5)
    back = torch.einsum("abij,hi,wj->ahbw", coeffs.reshape(a, b, h, w), dct.basis_h, dct.basis_w).reshape(shape)
    torch.testing.assert_close(dct.decode(coeffs), back, rtol=0, atol=1e-5)


def test_a_round_of_one_is_refused_by_fit_before_any_node_starts(node_pids):
    from exonet import LocalTrainer
    from exonet.strategies import DiLoCoStrategy
    from exonet.toy import synthetic_classification, tiny_mlp

    with pytest.raises(ValueError, match=r"participation=0.3 with K=3"):
        LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4)).fit(
            DiLoCoStrategy(participation=0.3, H=2), num_nodes=3, max_steps=2, progress=False)
    assert node_pids() == []
