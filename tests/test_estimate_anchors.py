"""Published anchors reproduced from hardware and topology (never from measured all-reduce times).

The formulas and figures reproduced, and where exonet departs from them, are stated in
exonet/netsim/README.md, section "Anchors". Estimates run at one outer round (or two steps):
every formula here is linear in the number of rounds.
"""

from __future__ import annotations

from functools import lru_cache

import pytest

from exonet import Scenario
from exonet.estimate import estimate, simulate_estimate
from exonet.estimate.solver import bandwidth_for_utilization
from exonet.strategies import DDPStrategy

Q = 989e12 * 0.4  # a chip's FLOP/s in T_comp = 6ND/(RQ): H100 dense bf16 at 40 % MFU
TOKENS = 2**20  # global batch per step, so D = steps · TOKENS
NETWORKS = [(400e9, 1e-4), (100e9, 1e-3), (10e9, 1e-2)]  # Scaling Laws for DiLoCo's three (W bit/s, ε s)
W0, E0 = 400e9, 1e-4  # inside a DiLoCo worker: their fastest network
R = 16  # chips


def paper(W1: float, e1: float, devices: int | None = None, collective: str = "ring") -> Scenario:
    """Chips with NICs of W1 bit/s and latency e1; with ``devices``, workers are hosts on a W0/E0 fabric."""
    d: dict = {"name": "scaling-laws", "network": {"bandwidth": f"{W1!r} bit/s", "latency": f"{e1!r} s",
                                                  "collective": collective}}
    if devices:
        d["hosts"] = {"devices": devices, "bandwidth": f"{W0 / 8!r} B/s", "latency": f"{E0!r} s"}
    return Scenario.from_dict(d)


def step_compute(N: float, chips: int) -> float:
    """One step of T_comp = 6ND/(RQ): 6·N·TOKENS FLOPs shared by ``chips`` chips of Q FLOP/s."""
    return 6 * N * TOKENS / (chips * Q)


@lru_cache(maxsize=None)
def ddp(N: float, nodes: int, step_time: float, steps: int = 1):
    return estimate(DDPStrategy("sgd", overlap=False), params=N, num_nodes=nodes, max_steps=steps, step_time=step_time,
                    dtype="bf16", layers=4)


@lru_cache(maxsize=None)
def diloco(N: float, nodes: int, H: int, step_time: float):
    return estimate(f"diloco:H={H}", params=N, num_nodes=nodes, max_steps=H, step_time=step_time, dtype="bf16",
                    layers=4)


def bits(est) -> float:
    """2N of the formulas in bits: the parameters the stack really holds, in bf16."""
    return 16 * est.params


# ---------------------------------------------------------------- Scaling Laws for DiLoCo, App. A
@pytest.mark.parametrize("N, chips", [(1e9, 8), (1e10, 8), (1e10, 16)])
@pytest.mark.parametrize("W1, e1", NETWORKS)
def test_data_parallel_per_step_is_the_scaling_laws_formula(N, chips, W1, e1):
    """DP per step: T_comp/T + 2N(1−1/R)/W₁ + ε₁; exonet's ring pays the latency per phase, 2(R−1)·ε₁.

    So a small model on many chips over a slow network departs by more than 5 % (1B on 16 chips at
    10 Gb/s: +7 %); the README's table gives the departure.
    """
    steps, t = 2, step_compute(N, chips)
    est = ddp(N, chips, t, steps)
    formula = steps * (t + 2 * bits(est) * (1 - 1 / chips) / W1 + e1)
    sim = simulate_estimate(est.trace, paper(W1, e1)).wall_clock_s
    assert sim == pytest.approx(formula, rel=0.05)
    assert sim - formula == pytest.approx(steps * (2 * (chips - 1) - 1) * e1, rel=1e-6)


@pytest.mark.parametrize("N, M, H", [(1e9, 2, 100), (1e10, 4, 50), (1e8, 8, 100)])
def test_diloco_round_is_the_scaling_laws_formula(N, M, H):
    """DiLoCo, M workers of G = R/M chips: H·[T_comp/T + 2N(1−M/R)/W₀ + ε₀] + 2N(1−1/R)/W₁ + ε₁ per round.

    Workers are hosts (fabric W₀, ε₀) and chips' NICs run at W₁. Each inner step is DDP over
    one worker's G chips (replayed on its host); the outer sync is DiLoCo over all R chips in
    the paper's flat ring. exonet departs by latency per phase only: H·(2(G−1)−1)·ε₀ + (2(R−1)−1)·ε₁.
    """
    G, t = R // M, step_compute(N, R)
    inner = ddp(N, G, t)
    for W1, e1 in NETWORKS:
        t_inner = simulate_estimate(inner.trace, paper(W1, e1, G)).wall_clock_s  # one step on one host
        outer = diloco(N, R, H, t_inner)
        formula = H * (t + 2 * bits(inner) * (1 - M / R) / W0 + E0) + 2 * bits(outer) * (1 - 1 / R) / W1 + e1
        sim = simulate_estimate(outer.trace, paper(W1, e1, G)).wall_clock_s
        assert sim == pytest.approx(formula, rel=0.05)
        assert sim - formula == pytest.approx(H * (2 * (G - 1) - 1) * E0 + (2 * (R - 1) - 1) * e1, rel=1e-6)
        hierarchical = simulate_estimate(outer.trace, paper(W1, e1, G, "hierarchical")).wall_clock_s
        assert hierarchical <= sim  # NCCL's way (inside the host first) never loses to the paper's flat ring


# ---------------------------------------------------------------- INTELLECT-1 (arXiv 2412.01152)
HOSTS, GPUS, H_I1, ROUND_S = 14, 8, 100, 38 * 60  # 14 nodes of 8×H100, H = 100 inner steps in 38 min
LINK_MS = {"US": None, "US+EU": 40, "global": 100}  # one region; or two of 7 nodes joined by this one-way latency
WAN_LATENCY = 20e-3


def intellect_scenario(nic_bytes_s: float, link_ms: int | None) -> Scenario:
    d: dict = {"name": "intellect-1", "network": {"bandwidth": f"{nic_bytes_s!r} B/s", "latency": f"{WAN_LATENCY!r} s"},
               "hosts": {"devices": GPUS, "bandwidth": "450 GB/s", "latency": "1 us", "nic": "per-host"}}
    if link_ms is not None:  # an ample link: the nodes' own WAN bandwidth is the bottleneck
        d["regions"] = [{"name": "a", "share": 0.5}, {"name": "b", "share": 0.5}]
        d["links"] = [{"between": ["a", "b"], "bandwidth": "1 Tbit/s", "latency": f"{link_ms} ms"}]
    return Scenario.from_dict(d)


def intellect_bandwidth(S: float, utilization: float, link_ms: int | None) -> float:
    """Per-node WAN bytes/s for ``utilization``: the hierarchical all-reduce's closed form solved for B.

    T_comm = ROUND_S·(1/u − 1) = 2(G−1)(α_f + S/G/B_f) + latencies + 2(n−1)/n·S/B (per-host NIC), with
    latencies 2(n−1)α in one region, or 2(n/2−1)α + 2α_l across two regions of n/2 nodes.
    """
    fabric = 2 * (GPUS - 1) * (1e-6 + S / GPUS / 450e9)
    if link_ms is None:
        latency = 2 * (HOSTS - 1) * WAN_LATENCY
    else:
        latency = 2 * (HOSTS // 2 - 1) * WAN_LATENCY + 2 * link_ms / 1e3
    return 2 * (HOSTS - 1) / HOSTS * S / (ROUND_S * (1 / utilization - 1) - fabric - latency)


@pytest.mark.parametrize("where, utilization, gbit_s", [("US", 0.957, 1.458), ("US+EU", 0.856, 0.388),
                                                         ("global", 0.830, 0.318)])
def test_intellect_1_utilisations_at_the_derived_bandwidths(where, utilization, gbit_s):
    # int8 pseudo-gradients of 10B parameters are 10 GB; exonet's DiLoCo sends its parameters' dtype, so a
    # 5B-parameter bf16 stack carries the same bytes
    est = diloco(5e9, HOSTS * GPUS, H_I1, ROUND_S / H_I1)
    S = est.trace.payload_bytes(0)
    assert S == pytest.approx(10e9, rel=1e-3)
    B = intellect_bandwidth(S, utilization, LINK_MS[where])
    assert B * 8 / 1e9 == pytest.approx(gbit_s, abs=5e-4)  # the figure the README states
    sim = simulate_estimate(est.trace, intellect_scenario(B, LINK_MS[where]))
    assert sim.utilization == pytest.approx(utilization, abs=1e-6)


# ---------------------------------------------------------------- the calculators, flat cases
@pytest.mark.parametrize("H", [1, 20])
def test_the_scaling_laws_calculator_flat_case_is_exact(H):
    """M = R one-chip workers, ε = 0: Total = T_comp + [2N(1−1/R)/W₁]·T/H; CU = T_comp/Total.

    The calculator's inner term 2N(1−M/R)/W₀ vanishes at M = R. exonet's ring is then the
    formula to float precision, and its solver finds the W₁ for a target CU within its 1 %.
    """
    nodes, N, W1 = 4, 1e9, 10e9
    t = step_compute(N, nodes)
    est = ddp(N, nodes, t, 2) if H == 1 else diloco(N, nodes, H, t)
    rounds = 2 if H == 1 else 1
    comm = 2 * bits(est) * (1 - 1 / nodes) / W1
    sim = simulate_estimate(est.trace, paper(W1, 0.0))
    assert sim.wall_clock_s == pytest.approx(rounds * (H * t + comm), rel=1e-9)
    assert sim.utilization == pytest.approx(H * t / (H * t + comm), rel=1e-9)
    for cu in (0.5, 0.9):
        need = 2 * bits(est) * (1 - 1 / nodes) / (H * t * (1 / cu - 1))
        assert bandwidth_for_utilization(est.trace, paper(W1, 0.0), cu) == pytest.approx(need, rel=0.011)
