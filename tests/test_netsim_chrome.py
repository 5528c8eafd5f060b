"""The Chrome/Perfetto trace's content: collective slices and their args, async overlap, message arrows,
link counters."""

from __future__ import annotations

import json

import numpy as np
import pytest

from exonet import Trace
from exonet.netsim import simulate
from exonet.scenario import LinkSpec, Resolved

B = 1.0e9
A = 1.0e-3
S = 10_000_003
exact = {"rel": 1e-9, "abs": 1e-9}


def two_regions(n: int = 4) -> Resolved:
    regions = ("us",) * (n // 2) + ("eu",) * (n - n // 2)
    return Resolved(num_nodes=n, uplink=(B,) * n, downlink=(B,) * n, region=regions, latency=A,
                    links={("eu", "us"): LinkSpec(bandwidth=B / 10, latency=A)}, speed=(1.0,) * n,
                    algorithms={"all_gather": "ring"}, name="two")


def overlapped_trace(n: int = 4) -> Trace:
    """Each rank: 0.1 s of compute, an async all-reduce of S under 0.2 s more compute, a wait; then 0 sends S to n-1."""
    t = Trace(n)
    for r in range(n):
        t.add_compute(r, 0.1)
        cid = t.add_collective(r, "all_reduce", S, async_op=True)
        t.add_compute(r, 0.2)
        t.add_wait(r, cid)
        if r < 2:
            t.add_collective(r, "all_gather", 1000, group=(0, 1))
        t.add_step(r)
    t.add_collective(0, "send", S, group=(0, n - 1))
    t.add_collective(n - 1, "recv", S, group=(0, n - 1))
    return t


@pytest.fixture
def replay(tmp_path):
    result = simulate(overlapped_trace(), two_regions())
    events = json.loads(result.to_chrome_trace(tmp_path / "trace.json").read_text())["traceEvents"]
    return result, events


def slices(events: list[dict]) -> list[tuple[dict, dict]]:
    """(begin, end) pairs of the async slices, matched by (pid, id)."""
    ends = {(e["pid"], e["id"]): e for e in events if e["ph"] == "e"}
    return [(b, ends[b["pid"], b["id"]]) for b in events if b["ph"] == "b"]


def test_every_member_shows_each_collective_with_its_op_bytes_group_and_algorithm(replay):
    result, events = replay
    pairs = slices(events)
    reduce = [(b, e) for b, e in pairs if b["args"]["op"] == "all_reduce"]
    assert sorted(b["pid"] for b, _ in reduce) == [0, 1, 2, 3]
    span = next(c for c in result.collectives if c.op == "all_reduce")
    for b, e in reduce:
        assert b["name"] == "all_reduce (async)" and b["tid"] == b["pid"]
        assert b["args"] == {"op": "all_reduce", "bytes": S, "group": [0, 1, 2, 3], "algorithm": "ring", "async": True}
        assert (b["ts"], e["ts"]) == (pytest.approx(span.start_s * 1e6, **exact),
                                      pytest.approx(span.end_s * 1e6, **exact))
    gather = [b for b, _ in pairs if b["args"]["op"] == "all_gather"]
    assert sorted(b["pid"] for b in gather) == [0, 1]
    assert all(b["name"] == "all_gather" and b["args"]["group"] == [0, 1] and not b["args"]["async"] for b in gather)


def test_an_async_collective_overlaps_its_nodes_compute(replay):
    result, events = replay
    for b, e in slices(events):
        if b["args"]["op"] != "all_reduce":
            continue
        computing = [x for x in events if x["ph"] == "X" and x["pid"] == b["pid"] and x["name"] == "compute"]
        assert any(x["ts"] < b["ts"] < x["ts"] + x["dur"] for x in computing)  # issued mid-compute (at 0.1 s of 0.3 s)
        assert b["ts"] == pytest.approx(0.1e6, **exact)


def test_a_message_is_an_arrow_from_where_it_left_to_where_it_arrived(replay):
    result, events = replay
    send = next(c for c in result.collectives if c.op == "send")
    assert send.group == (0, 3) and send.algorithm == "direct"
    assert send.end_s - send.start_s == pytest.approx(A + S / (B / 10), **exact)  # the region link's α and rate
    out = [e for e in events if e["ph"] == "s"]
    into = [e for e in events if e["ph"] == "f"]
    assert len(out) == len(into) == 1 and out[0]["id"] == into[0]["id"]
    assert (out[0]["pid"], out[0]["tid"], into[0]["pid"], into[0]["tid"]) == (0, 0, 3, 3)
    assert out[0]["ts"] == pytest.approx(send.start_s * 1e6, **exact)
    assert into[0]["ts"] == pytest.approx(send.end_s * 1e6, **exact) and into[0]["bp"] == "e"
    names = {b["pid"]: b["name"] for b, _ in slices(events) if b["args"]["op"] == "send"}
    assert names == {0: "send → 3", 3: "recv ← 0"}


def test_each_link_that_carried_bytes_has_a_utilization_counter_whose_mean_is_its_utilization(replay):
    result, events = replay
    counters: dict[str, list[dict]] = {}
    for e in events:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append(e)
    used = {link.name: link for link in result.links if link.bytes > 0}
    assert set(counters) == set(used) and "us->eu" in counters
    network = {e["pid"] for e in events if e["ph"] == "C"}
    assert network == {4}
    assert {"ph": "M", "name": "process_name", "pid": 4, "tid": 0, "args": {"name": "network: two"}} in events
    for name, samples in counters.items():
        values = [s["args"]["utilization"] for s in samples]
        assert values[-1] == 0.0 and samples[-1]["ts"] == pytest.approx(result.wall_clock_s * 1e6, **exact)
        assert np.mean(values[:-1]) == pytest.approx(used[name].utilization, **exact)


def test_link_series_is_flat_over_a_lone_collective_and_zero_outside_it():
    n = 3
    t = Trace(n)
    for r in range(n):
        t.add_collective(r, "all_reduce", S)
        t.add_compute(r, 1.0)
        t.add_step(r)
    result = simulate(t, Resolved(num_nodes=n, uplink=(B,) * n, downlink=(B,) * n, region=("d",) * n, latency=A,
                                  links={}, speed=(1.0,) * n, algorithms={}))
    duration = 4 * A + 4 / 3 * S / B  # the ring all-reduce, then 1 s of compute
    assert result.wall_clock_s == pytest.approx(duration + 1.0, **exact)
    windows = round(result.wall_clock_s / duration)  # so the collective fills about the first window
    edges, series = result.link_series(windows, [0])
    assert len(edges) == windows + 1 and series.shape == (1, windows)
    first = min(duration, edges[1])
    assert series[0, 0] == pytest.approx(4 / 3 * S * first / duration / (B * edges[1]), **exact)
    assert series[0, 2:] == pytest.approx(np.zeros(windows - 2), abs=1e-15)


def test_outputs_go_into_folders_made_on_the_way_and_leave_no_temporary_file(tmp_path):
    """``--chrome-trace out/run.json`` on a fresh checkout: the folder is made (it was a traceback naming
    the hidden temporary file); the trace and the Chrome trace land whole, nothing else beside them."""
    trace = overlapped_trace()
    saved = trace.save(tmp_path / "a" / "b" / "run.jsonl")
    assert Trace.load(saved).events == trace.events
    chrome = simulate(trace, two_regions()).to_chrome_trace(tmp_path / "c" / "x.json")
    assert json.loads(chrome.read_text())["traceEvents"]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["run.jsonl", "x.json"]
