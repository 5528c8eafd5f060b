"""DDP's concurrent bucket all-reduces and per-step broadcast on real tbf-shaped links (root only)."""

from __future__ import annotations

import os
import subprocess

import pytest

from exonet.trace import Collective, Step, Wait
from exonet.validate.buckets import MIB, BucketCase, BucketMeasurement, run_case
from exonet.validate.netns import Shaper, leftovers, privilege

REASON = privilege()
# Where a measured median may lie. Below, the floor is the lossless model's time less LOSSLESS_BELOW (the library
# band's lowest ratio of model to real, 0.993, rounded out): the queue's losses can only add to it. The range's p10
# is not a floor: eight measurements here (load 5.5-8) put the median between 1.2% below p10 and 1.7% above p90,
# and a clean-clone CI machine measured 1.403 s, 3.8% below p10 (1.458 s) and 2.9% above the lossless 1.363 s, as
# that machine's queue cost less recovery. Above: p90 plus 20%, because clean-clone CI machines measured medians of
# 1.58-1.78 s (p90 1.55 s): retransmission timeouts that a busier machine meets more often, which the range (drawn
# from this machine's scatter) does not cover yet (validate README, "DDP through a real shaper").
LOSSLESS_BELOW, RANGE_ABOVE = 0.02, 0.20


def test_the_scenario_is_the_shapers_configuration_with_wall_clock_compute():
    case = BucketCase(2, 100e6 / 8, shaper=Shaper(latency=0.005))
    net = case.scenario().resolve(2)
    assert net.uplink == (12.5e6, 12.5e6) and net.compute_mode == "wall"
    assert net.queue == (int(12.5e6 * 0.005) + 32768, "bytes") and net.streams == 1
    assert case.scenario(ideal=True).resolve(2).queue is None


@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=f"needs network namespaces: {REASON}")
def test_ddp_buckets_and_broadcast_on_a_shallow_tbf_queue():
    """K = 2 at 100 Mbit/s behind tbf burst 32768 latency 5 ms: every step broadcasts 256 KiB from rank 0,
    then launches four bucket all-reduces (1, 2, 2, 2 MiB) during the backward before waiting on any.
    The queue overflows (drops and retransmissions are counted), so the model predicts a range
    (``SimResult.wall_clock_range``, p10-p90 of the recovery cost): replaying the nodes' own trace on the
    scenario of the shaper's configuration, the median of one measurement (five repeats) lies between the
    lossless model's time (less LOSSLESS_BELOW) and p90 (plus RANGE_ABOVE), and the lossless time lies below
    the range. Nothing is left behind."""
    case = BucketCase(2, 100e6 / 8, steps=2, repeats=5, shaper=Shaper(latency=0.005))
    m = run_case(case)
    model, ideal = m.predict(), m.predict(ideal=True)
    low, high = m.predicted_range()
    print(f"\nreal {m.real:.3f} s ({m.times}), ideal {ideal:.3f} s, model {model:.3f} s "
          f"(p10-p90 {low:.3f}-{high:.3f}), losses {m.losses}")
    for trace in m.traces:
        for events in trace.events:
            colls = [e for e in events if isinstance(e, Collective)]
            assert [(c.op, c.nbytes, c.async_op) for c in colls] == case.steps * (
                [("broadcast", MIB // 4, False)] + [("all_reduce", b, True) for b in case.buckets])
            kinds = [type(e).__name__ for e in events if isinstance(e, (Collective, Wait, Step))]
            assert kinds == case.steps * (["Collective"] * 5 + ["Wait"] * 4 + ["Step"])
    assert m.losses["drops"] > 0 and m.losses["retransmits"] > 0
    assert low < model < high  # a lossy case has a range
    inside = (ideal * (1 - LOSSLESS_BELOW), high * (1 + RANGE_ABOVE))
    assert inside[0] <= m.real <= inside[1], f"median {m.real:.3f} s outside {inside[0]:.3f}-{inside[1]:.3f} s"
    assert ideal < low  # the queue's losses are priced: the range lies above the lossless model
    mine = [name for _, name in leftovers(include_live=True) if name.startswith(f"exv{os.getpid():x}-")]
    assert mine == [] and f"exv{os.getpid():x}-" not in subprocess.run(
        ["tc", "qdisc", "show"], capture_output=True, text=True).stdout


def test_the_slowlinks_matrix_command_reports_every_table(monkeypatch, capsys):
    """``exonet validate --matrix slowlinks`` runs the matrix, the held-out cases, the corners, the back-to-back
    cases, the sweep of streams through a shallow queue, its held-out cases and DDP's buckets, and prints each
    table with its loss counters (the runs themselves are stubbed: each case 'measures' its own model time, so
    every model error is 0)."""
    from exonet.validate import buckets, command, netns, slowlinks
    from exonet.validate.slowlinks import SlowMeasurement

    losses = {"retransmits": 1, "timeouts": 2, "probes": 3, "drops": 4}
    monkeypatch.setattr(netns, "privilege", lambda: None)
    monkeypatch.setattr(slowlinks, "run_case", lambda case: SlowMeasurement(case, [case.predict()], dict(losses)))
    monkeypatch.setattr(buckets, "run_case", lambda case: _stub_ddp(case))
    assert command.main(["--matrix", "slowlinks"]) == 0
    out = capsys.readouterr().out
    for title, cases in (("read the recovery constant from", slowlinks.matrix()), ("held out", slowlinks.held_out()),
                         ("the matrix's corners", slowlinks.corners()), ("back to back", slowlinks.back_to_back()),
                         ("many streams in a shallow queue", slowlinks.stream_sweep()),
                         ("many streams, held out", slowlinks.stream_held_out()), ("DDP", buckets.matrix())):
        assert f"{len(cases)} cases ({title}" in out
    assert out.count("| case | real s | ideal s (err) | model s (err) | retrans | timeouts | probes | drops |") == 7
    assert out.count("model: median |error| 0.0%, worst 0.0%") == 7
    assert "| 1 | 2 | 3 | 4 |" in out


def _stub_ddp(case: BucketCase) -> BucketMeasurement:
    """A measurement of ``case`` whose one repeat took exactly what the model replays for its trace."""
    from exonet.trace import Trace

    trace = Trace(case.k)
    for r in range(case.k):
        for _ in range(case.steps):
            trace.add_collective(r, "broadcast", case.broadcast)
            trace.add_compute(r, case.forward_s)
            ids = []
            for size in case.buckets:
                trace.add_compute(r, case.backward_s / len(case.buckets))
                ids.append(trace.add_collective(r, "all_reduce", size, async_op=True))
            for cid in ids:
                trace.add_wait(r, cid)
            trace.add_step(r)
    m = BucketMeasurement(case, [0.0], [trace], {"retransmits": 1, "timeouts": 2, "probes": 3, "drops": 4})
    m.times = [m.predict()]
    return m
