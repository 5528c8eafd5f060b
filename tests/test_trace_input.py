"""Trace input is checked where it enters (files and the builder), and the Chrome export is strict JSON.

Bad files are refused with the file and field named, rather than accounted as nonsense (a
compute of -5 s; NaN in per-node times and a bare ``nan`` in the Chrome trace), and valid
traces load ("collectives must match" is not raised for a full group spelt out, or a group
listed in another order).
"""

from __future__ import annotations

import json
import math
from array import array
from pathlib import Path

import pytest

from exonet import Scenario, Trace, TraceError, simulate
from exonet.netsim.result import SimResult
from exonet.netsim.spans import Timeline

SCENARIO = Scenario.from_dict({"name": "t", "network": {"bandwidth": "8 Mbit/s", "latency": "1 ms"}})  # 1 MB/s
HEADER = {"format": "exonet-trace", "version": 1, "num_nodes": 3, "meta": {}}


def write(path: Path, events: list[str], num_nodes: int = 3) -> Path:
    """A trace file with ``events`` (JSON text, one per line) between a valid header and footer."""
    head = json.dumps({**HEADER, "num_nodes": num_nodes})
    path.write_text("\n".join([head, *events, json.dumps({"end": True, "events": len(events)})]) + "\n")
    return path


def gather(rank: int, group: str) -> str:
    return f'["x", {rank}, 0, "all_gather", 1000, {group}, 0, "float32", null, null]'


def strict_json(text: str):
    def reject(name):
        raise ValueError(f"{name} in JSON")
    return json.loads(text, parse_constant=reject)


@pytest.mark.parametrize("event, complaint", [
    ('["c", 0, -5.0, -5.0, 0]', "seconds must be finite and >= 0"),
    ('["c", 0, 1.0, -1.0, 0]', "cpu_s must be finite and >= 0"),
    ('["c", 0, 1.0, 1.0, -1e9]', "flops must be finite and >= 0"),
    ('["c", 0, NaN, 0.5, 0]', "NaN is not a JSON number"),
    ('["c", 0, Infinity, 0.5, 0]', "Infinity is not a JSON number"),
    ('["c", 0, 1e400, 0.5, 0]', "seconds must be finite"),                   # a literal that overflows to inf
    ('["c", 0, "1.5", 0.5, 0]', "seconds must be a number"),
    ('["c", 0, 1e16, 0.5, 0]', r"seconds must be at most 1e\+15"),          # sums of such spans overflow
    ('["x", 0, 0, "all_reduce", 9223372036854775808, null, 0, "float32", null, null]', r"below 2\*\*63"),
    ('["x", 0, 0, "all_reduce", -8, null, 0, "float32", null, null]', "nbytes must be a non-negative integer"),
    ('["x", 0, 0, "all_reduce", 8.5, null, 0, "float32", null, null]', "nbytes must be a non-negative integer"),
    ('["x", 0, 0, "all_reduce", 8, [0, 0, 1], 0, "float32", null, null]', r"\[0, 0, 1\] \(rank 0 twice\)"),
    ('["x", 0, 0, "all_reduce", 8, [0, 3], 0, "float32", null, null]',
     r"distinct ranks in \[0, 3\), got \[0, 3\] \(rank 3 is outside\)"),
    ('["x", 0, 0, "all_reduce", 8, [1, 2], 0, "float32", null, null]', "not a member"),
    ('["x", 0, 0, "all_reduce", 8, [], 0, "float32", null, null]', r"\(it is empty\)"),
    ('["x", 0, 0, "all_reduce", 8, null, 2, "float32", null, null]', "async must be 0 or 1"),
    ('["x", 0, 0, "all_reduce", 8, null, 0, "float32", "soon", null]', "start_s must be a finite number"),
    ('["x", 0, 0, "all_reduce", 8, null, 0]', "has 10 fields"),
    ('["w", 0, 4]', "has not issued as async"),
    ('["s", true]', "out of range"),
])
def test_a_bad_event_is_a_trace_error_naming_the_file_and_line(tmp_path, event, complaint):
    path = write(tmp_path / "bad.jsonl", ['["s", 1]', event])
    with pytest.raises(TraceError, match=rf"bad\.jsonl:3: .*{complaint}"):
        Trace.load(path)


def test_a_collective_id_issued_twice_is_refused(tmp_path):
    path = write(tmp_path / "twice.jsonl", ['["x", 0, 0, "all_reduce", 8, null, 1, "float32", null, null]',
                                            '["x", 0, 0, "all_reduce", 8, null, 1, "float32", null, null]'])
    with pytest.raises(TraceError, match=r"twice\.jsonl:3: .*collective id 0 twice"):
        Trace.load(path)


@pytest.mark.parametrize("header, complaint", [
    ({**HEADER, "num_nodes": True}, "num_nodes must be an integer"),
    ({**HEADER, "num_nodes": 10**9}, "num_nodes must be an integer"),
    ({**HEADER, "meta": "notes"}, "meta must be an object"),
])
def test_a_bad_header_is_a_trace_error_naming_line_1(tmp_path, header, complaint):
    path = tmp_path / "head.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps({"end": True, "events": 0}) + "\n")
    with pytest.raises(TraceError, match=rf"head\.jsonl:1: {complaint}"):
        Trace.load(path)


@pytest.mark.parametrize("spellings", [
    ("[0, 1, 2]", "null", "[2, 0, 1]"),      # the whole world spelt out, in any order, is null
    ("[1, 0]", "[0, 1]", None),              # a group's order carries no meaning
])
def test_equal_groups_spelt_differently_load_and_simulate_alike(tmp_path, spellings):
    as_written = [s for s in spellings if s is not None]
    ranks = range(len(as_written))
    canonical = Trace(3)
    for r, spelt in zip(ranks, as_written):
        canonical.add_collective(r, "all_gather", 1000, group=json.loads(spelt))
    loaded = Trace.load(write(tmp_path / "groups.jsonl", [gather(r, s) for r, s in zip(ranks, as_written)]))
    assert loaded.events == canonical.events
    expected = None if len(as_written) == 3 else (0, 1)
    assert {e.group for evs in loaded.events for e in evs} == {expected}
    result = simulate(loaded, SCENARIO)
    s = 1000 / 1e6
    n = len(as_written)
    assert result.wall_clock_s == pytest.approx((n - 1) * (1e-3 + s), rel=1e-12)  # ring all-gather closed form


def test_a_negative_compute_no_longer_reaches_the_simulator(tmp_path):
    # before: rank 0 got compute 0 and idle 6.0 against a wall of 1.002
    path = write(tmp_path / "neg.jsonl", ['["c", 0, -5.0, -5.0, 0]', '["c", 1, 1.0, 1.0, 0]'], num_nodes=2)
    with pytest.raises(TraceError, match=r"neg\.jsonl:2"):
        Trace.load(path)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_the_builder_refuses_compute_seconds_that_are_negative_or_not_finite(bad):
    with pytest.raises(ValueError, match="Trace.add_compute: seconds, cpu_s and flops must be >= 0 and finite; "
                                         "seconds must be finite"):
        Trace(3).add_compute(0, bad)


def test_the_builder_applies_the_file_rules():
    t = Trace(3)
    with pytest.raises(ValueError, match="cpu_s must be finite"):
        t.add_compute(0, 1.0, cpu_s=math.nan)
    with pytest.raises(ValueError, match="Trace.add_collective: nbytes must be a non-negative integer"):
        t.add_collective(0, "all_reduce", 2.5)
    with pytest.raises(ValueError, match="rank 0 twice"):
        t.add_collective(0, "all_reduce", 8, group=(0, 0, 1))
    with pytest.raises(ValueError, match="rank 7 is outside"):
        t.add_collective(0, "all_reduce", 8, group=(0, 7))
    assert t.events == [[], [], []]                                         # a refused event leaves no trace
    assert t.add_collective(0, "all_reduce", 8, group=[1, 0]) == 0          # a refused one used no id either
    t.add_collective(0, "all_reduce", 8, group=[2, 1, 0])
    assert [e.group for e in t.collectives(0)] == [(0, 1), None]


def test_chrome_trace_is_strict_json_and_refuses_a_non_finite_time(tmp_path):
    t = Trace(2)
    for r in range(2):
        t.add_compute(r, 0.25 * (r + 1))
        t.add_collective(r, "all_reduce", 10_000)
        t.add_step(r)
    doc = strict_json(simulate(t, SCENARIO).to_chrome_trace(tmp_path / "ok.json").read_text())
    assert {e["tid"] for e in doc["traceEvents"]} == {0, 1}
    bad = SimResult(math.nan, [], [], [], 0.0, timelines=[Timeline(array("d", [0.0, math.nan]), bytes([0]), math.nan)])
    with pytest.raises(ValueError, match="node 0 .*finite times"):
        bad.to_chrome_trace(tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()
