"""Published results, reproduced: the papers' own timing models written as exonet traces and replayed.

Each function builds the schedule a paper describes as a ``Trace`` and simulates it
with exonet's engine (ring closed forms, collectives of one group in issue order), so
the figures come from the same model that replays recorded runs, not from per-row
constants.

* ``streaming_diloco_table4``: Streaming DiLoCo (Douillard et al., arXiv 2501.18512),
  Table 4. The paper simulates a DAG per layer l and step: forward F(l), backward
  w.r.t. activations Ba(l) (none for the first layer) and parameters Bp(l), each
  T/(3L), on one in-order compute stream; the reduction R(l) of a synced layer is
  issued when Bp(l) ends, reductions run one at a time in issue order, and F(l) of
  step t+1+τ waits for R(l) of step t. Data-parallel reduces every layer every step,
  DiLoCo every layer every H steps, Streaming DiLoCo strided fragments (fragment p =
  layers p, p+F, ...) at offsets p·⌊H/(F+1)⌋, "+ overlap" with τ = 1, FP4 with 4-bit
  values. Assumptions the paper leaves open: M = 2 workers, bf16 values, a ring
  all-reduce, zero latency, N = 1e9 split evenly over 24 layers. Compute utilisation
  is measured in the steady state, steps H+1..2H+1.
* ``intellect1_utilization``: INTELLECT-1's 100 inner steps in 38 min against its
  median all-reduce times, and the per-node bandwidth a ring all-reduce of the int8
  pseudo-gradient among 14 nodes needs to take that long.
* ``distro_example``: DisTrO's worked example, an all-gather of 2.8 MB from each of 31
  peers on 100 Mbit/s down / 10 Mbit/s up links.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exonet.estimate.solver import lowest_bandwidth
from exonet.netsim import simulate
from exonet.scenario import Scenario
from exonet.trace import Collective, Compute, Step, Trace, Wait

GRID_GBPS = np.logspace(-1, 3, 50)  # the bandwidth grid of Table 4, Gbit/s
GRID_STEP = float(GRID_GBPS[1] / GRID_GBPS[0])  # ×1.207
TARGETS = (0.5, 0.8, 0.9, 0.95, 0.99)
METHODS = ("data-parallel", "DiLoCo H=100", "Streaming DiLoCo", "+ overlap", "+ overlap, FP4")
TABLE4_1B = {  # the paper's 1B row: Gbit/s needed for each compute utilisation
    "data-parallel": (86.8, 152.6, 184.2, 222.3, 569.0),
    "DiLoCo H=100": (1.4, 6.2, 13.3, 23.3, 86.8),
    "Streaming DiLoCo": (1.4, 5.2, 9.1, 16.0, 28.1),
    "+ overlap": (1.4, 4.3, 6.2, 9.1, 11.0),
    "+ overlap, FP4": (0.4, 0.9, 1.7, 2.0, 3.0),
}


@dataclass(frozen=True)
class LayerDAG:
    """The paper's per-layer schedule for one method.

    Args:
        method: one of ``METHODS``.
        params: model parameters, split evenly over the layers.
        layers: L.
        step_time: T, seconds of compute per step (F, Ba, Bp each T/(3L)).
        H: inner steps between syncs of a layer.
        fragment_layers: layers per Streaming DiLoCo fragment (strided).
        tau: steps an overlapped fragment may stay in flight.
    """

    method: str
    params: float = 1e9
    layers: int = 24
    step_time: float = 0.1
    H: int = 100
    fragment_layers: int = 3
    tau: int = 1

    @property
    def bits(self) -> int:
        return 4 if "FP4" in self.method else 16

    @property
    def delay(self) -> int:
        """F(l) of step t + delay waits for R(l) of step t."""
        return 1 + (self.tau if "overlap" in self.method else 0)

    def synced(self, step: int) -> Sequence[int]:
        """The layers reduced at ``step`` (1-based)."""
        L, H = self.layers, self.H
        if self.method == "data-parallel":
            return range(L)
        if self.method.startswith("DiLoCo"):
            return range(L) if step % H == 0 else ()
        count = L // self.fragment_layers
        spacing = H // (count + 1)
        return [p + k * count for p in range(count) if step >= p * spacing and (step - p * spacing) % H == 0
                for k in range(self.fragment_layers)]

    def trace(self, steps: int, nodes: int = 2) -> Trace:
        """Every node runs the same schedule; reductions are async all-reduces on the world group."""
        u = self.step_time / (3 * self.layers)
        nbytes = round(self.params / self.layers * self.bits / 8)
        span = Compute(u, u)
        events: list = []
        pending: dict[tuple[int, int], int] = {}  # (layer, step that needs it) -> collective id
        cid = 0
        for s in range(1, steps + 1):
            for layer in range(self.layers):
                if (layer, s) in pending:
                    events.append(Wait(pending.pop((layer, s))))
                events.append(span)  # F(layer)
            synced = set(self.synced(s))
            for layer in reversed(range(self.layers)):
                events.extend((span, span) if layer else (span,))  # Ba(layer), Bp(layer); no Ba for the first
                if layer in synced:
                    events.append(Collective(cid, "all_reduce", nbytes, None, True, "bfloat16"))
                    pending[(layer, s + self.delay)] = cid
                    cid += 1
            events.append(Step())
        return Trace(nodes, {"published": "streaming-diloco-table4", "method": self.method},
                     [list(events) for _ in range(nodes)])

    def utilization(self, gbps: float, trace: Trace | None = None) -> float:
        """Steady-state compute utilisation at ``gbps`` Gbit/s per NIC (steps H+1..2H+1; DP: 10..H+1)."""
        first = 10 if self.method == "data-parallel" else self.H + 1
        last = first + self.H
        trace = trace or self.trace(last)
        scenario = Scenario.from_dict({"name": "table4", "network": {"bandwidth": f"{gbps!r} Gbit/s"},
                                       "compute": {"mode": "wall"}})
        ends = simulate(trace, scenario).step_end_times
        compute_per_step = self.step_time * (1 - 1 / (3 * self.layers))  # no Ba for the first layer
        return (last - first) * compute_per_step / (ends[last - 1] - ends[first - 1])


def streaming_diloco_table4(params: float = 1e9) -> dict[str, tuple[float | None, ...]]:
    """Gbit/s each method needs for each of ``TARGETS``, as exonet replays the paper's DAG."""
    out = {}
    for method in METHODS:
        dag = LayerDAG(method, params=params)
        trace = dag.trace((10 if method == "data-parallel" else dag.H + 1) + dag.H)
        out[method] = tuple(lowest_bandwidth(lambda g: dag.utilization(g, trace), u, low=1e-3, high=1e5, rtol=1e-3)
                            for u in TARGETS)
    return out


# ------------------------------------------------------------------ INTELLECT-1
INTELLECT1: dict[str, Any] = {"params": 10e9, "nodes": 14, "inner_steps": 100, "inner_minutes": 38.0,
              "all_reduce_s": (103.0, 382.0, 469.0), "utilization": (0.957, 0.856, 0.830)}


def intellect1(all_reduce_s: float) -> tuple[float, float]:
    """(per-node bit/s, compute utilisation) of an INTELLECT-1 outer round whose all-reduce took ``all_reduce_s``.

    The bandwidth is the one at which a ring all-reduce of the int8 pseudo-gradient (1 byte
    per parameter) among the 14 nodes takes exactly ``all_reduce_s``; the utilisation is
    exonet's replay of one round, 100 inner steps of compute then that blocking all-reduce.
    """
    n, payload = INTELLECT1["nodes"], round(INTELLECT1["params"])
    bandwidth = 8 * 2 * (n - 1) / n * payload / all_reduce_s  # ring: 2(n-1)/n · S / B, zero latency
    t = Trace(n)
    for r in range(n):
        t.add_compute(r, INTELLECT1["inner_minutes"] * 60.0)
        t.add_collective(r, "all_reduce", payload, dtype="int8")
        t.add_step(r)
    scenario = Scenario.from_dict({"name": "intellect-1", "network": {"bandwidth": f"{bandwidth!r} bit/s"},
                                   "compute": {"mode": "wall"}})
    return bandwidth, simulate(t, scenario).utilization


# ------------------------------------------------------------------ DisTrO
def distro_example(peers: int = 32, payload: float = 2.8e6) -> tuple[float, float]:
    """(download s, upload s) of DisTrO's example on 100 Mbit/s down, 10 Mbit/s up links.

    Download: every peer all-gathers ``payload`` bytes from each of the others directly, so
    (peers − 1)·payload queue on its downlink (the uplinks, each sending one copy per peer,
    are modelled as a relay's: not the bottleneck). Upload: a peer sends its payload once.
    """
    down = Trace(peers)
    for r in range(peers):
        down.add_collective(r, "all_gather", round(payload))
        down.add_step(r)
    fan_in = {"name": "distro-down",
              "network": {"downlink": "100 Mbit/s", "uplink": "100 Gbit/s", "collective": "direct"}}
    up = Trace(2)
    for r in range(2):
        up.add_collective(r, "broadcast", round(payload))
        up.add_step(r)
    send = {"name": "distro-up", "network": {"downlink": "100 Mbit/s", "uplink": "10 Mbit/s", "collective": "direct"}}
    return simulate(down, Scenario.from_dict(fan_in)).wall_clock_s, simulate(up, Scenario.from_dict(send)).wall_clock_s
