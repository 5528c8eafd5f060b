"""Elastic strategies, elastic where it matters (issue 33, part 4): collectives go on without a member that
fails, an elastic strategy without failures is its blocking self, and runs report the tokens they trained."""

from __future__ import annotations

import json
import warnings

import pytest

from exonet import Scenario, Trace, compare, simulate
from exonet.cli import main
from exonet.estimate import estimate, simulate_estimate
from exonet.study.tokens import trained

S = 100_000_000  # a 100 MB all-reduce: 0.8 s between two nodes at 1 Gbit/s, 2·(2/3)·0.8 s among three
NET = {"bandwidth": "1 Gbit/s"}
WAN = {"bandwidth": "1 Gbit/s", "latency": "30 ms"}


def down(rank: int, start: float, length: float = 100.0) -> dict:
    return {"kind": "down", "ranks": [rank], "from_s": start, "to_s": start + length}


def failed_round(elastic: bool) -> Trace:
    """Three nodes compute 10 s and all-reduce; rank 1 fails inside it, so the next round is (0, 2)'s alone
    and rank 1 discards its work, as an elastic strategy records it. 100 tokens per node-step."""
    t = Trace(num_nodes=3, meta={"elastic": True, "tokens_per_step": 100} if elastic else {"tokens_per_step": 100})
    for r in range(3):
        t.add_compute(r, 10.0)
        t.add_collective(r, "all_reduce", S)
        t.add_step(r)
    for r in (0, 2):
        t.add_compute(r, 10.0)
        t.add_collective(r, "all_reduce", S, group=(0, 2))
        t.add_step(r)
    t.add_discard(1)
    t.add_step(1)
    return t


def test_an_elastic_collective_aborts_on_a_members_failure_and_goes_on_without_it():
    """Rank 1 fails 0.5 s into the all-reduce: (0, 2) start it again without it at once (0.8 s), and the
    0.5 s each of the three spent in the aborted attempt is lost work, not communication.
    A blocking run waits the 100 s out."""
    sc = {"name": "fails inside", "network": NET, "events": [down(1, 10.5)]}
    res = simulate(failed_round(True), sc)
    assert [(c.start_s, c.end_s, c.group) for c in res.collectives] == [(10.5, 11.3, (0, 2)), (21.3, 22.1, (0, 2))]
    assert res.wall_clock_s == 22.1
    assert [p.aborted_s for p in res.per_node] == [0.5, 0.5, 0.5]
    assert res.lost["lost_work"] == 10.0 + 3 * 0.5  # rank 1's discarded round, and the aborted attempt
    assert res.lost["comm"] == pytest.approx(2 * 1.6)  # (0, 2)'s two all-reduces that went through
    machine = 3 * res.wall_clock_s
    assert res.goodput * machine + sum(res.lost.values()) == pytest.approx(machine, rel=1e-12)
    assert simulate(failed_round(False), sc).wall_clock_s > 110.0


@pytest.mark.parametrize("start", [0.5, 1.3])
def test_elastic_ddp_goes_on_without_a_node_that_fails_mid_step(start):
    """Rank 1 goes down for 100 s in step 1: at 0.5 s, in backward after its first bucket went (the others
    are in the later buckets' all-reduces without it), or at 1.3 s, inside an all-reduce. Elastic DDP
    (bucketed, as blocking DDP) goes on without it; blocking DDP waits the 100 s out (elastic did too)."""
    sc = Scenario.from_dict({"name": "wan", "network": WAN, "events": [down(1, start)]})
    runs = {name: simulate_estimate(estimate(name, params=2e7, num_nodes=3, max_steps=4, step_time=1.0,
                                             scenario=sc), sc) for name in ("ddp", "ddp:elastic=True")}
    assert runs["ddp"].wall_clock_s > 100.0
    elastic = runs["ddp:elastic=True"]
    assert elastic.wall_clock_s < 7.0
    assert elastic.steps_trained == 8  # rank 1 trains none of its steps: its first is dropped, then it is out
    assert runs["ddp"].steps_trained == 12
    if start > 1.0:  # it failed inside an all-reduce: the attempt it aborted is lost work
        assert sum(p.aborted_s for p in elastic.per_node) > 0
        assert elastic.lost["lost_work"] > 0
    else:  # its buckets after the first were dropped: the step it had computed before failing is lost
        assert elastic.lost["lost_work"] == pytest.approx(start, rel=1e-9)


@pytest.mark.parametrize("blocking", ["ddp", "ddp:overlap=False", "diloco:H=2"])
def test_an_elastic_strategy_without_failures_is_its_blocking_self_to_the_tick(blocking):
    """Elastic DDP was one flat all-reduce (17.1 s a step against 42.5 s in the issue's study): now the same
    buckets, overlapped with backward, so the bytes and the time are equal exactly."""
    sc = Scenario.from_dict({"name": "wan", "network": WAN})
    elastic = blocking + (",elastic=True" if ":" in blocking else ":elastic=True")
    a, b = (simulate_estimate(estimate(s, params=2e7, num_nodes=3, max_steps=4, step_time=1.0, scenario=sc), sc)
            for s in (blocking, elastic))
    assert a.wire_bytes == b.wire_bytes
    assert a.wall_clock_s == b.wall_clock_s
    assert a.steps_trained == b.steps_trained == 12


def test_compare_reports_tokens_trained_and_time_per_token():
    """An elastic run that dropped rank 1's work trains 4 node-steps of 6: 400 tokens in 22.1 s."""
    sc = {"name": "fails inside", "network": NET, "events": [down(1, 10.5)]}
    table = compare({"elastic": failed_round(True)}, [sc])
    row = table.rows[0]
    assert (row["steps_trained"], row["tokens"]) == (4, 400.0)
    assert row["time_per_token_s"] == pytest.approx(22.1 / 400, rel=1e-12)
    assert row["time_per_step_s"] == pytest.approx(22.1 * 3 / 4, rel=1e-12)
    assert "| tokens | time/token | steps kept | time/step |" in table.to_markdown()
    plain = compare({"ddp": _ddp_trace()}, [{"name": "ok", "network": NET}])
    assert plain.rows[0]["tokens"] is None and plain.rows[0]["steps_trained"] == 6
    assert "tokens" not in plain.to_markdown() and "steps kept" not in plain.to_markdown()


def _ddp_trace() -> Trace:
    t = Trace(num_nodes=3)
    for _ in range(2):
        for r in range(3):
            t.add_compute(r, 1.0)
            t.add_collective(r, "all_reduce", 1000)
            t.add_step(r)
    return t


def test_estimate_reports_tokens_trained_beside_the_time(tmp_path, capsys):
    """exonet estimate --json: tokens trained and time per token per scenario; elastic DDP that loses a node
    for good trains a third fewer tokens than blocking DDP, and its time per token says what that bought."""
    toml = tmp_path / "outage.toml"
    toml.write_text('name = "outage"\n[network]\nbandwidth = "1 Gbit/s"\nlatency = "30 ms"\n'
                    '[[events]]\nkind = "down"\nranks = [1]\nfrom_s = 1.3\nto_s = 101.3\n')
    rows = {}
    for strategy in ("ddp", "ddp:elastic=True"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["estimate", "--strategy", strategy, "--nodes", "3", "--steps", "4", "--model-params", "2e7",
                         "--tokens-per-step", "1000", "--tflops", "0.24", "--mfu", "0.5", "--scenario", str(toml),
                         "--json"]) == 0
        rows[strategy] = json.loads(capsys.readouterr().out)["scenarios"][0]
    blocking, elastic = rows["ddp"], rows["ddp:elastic=True"]
    assert blocking["tokens"] == 12 * 1000 and elastic["tokens"] == 8 * 1000
    for row in (blocking, elastic):
        assert row["time_per_token_s"] == pytest.approx(row["wall_clock_s"] / row["tokens"], rel=1e-12)
    assert elastic["time_per_token_s"] < blocking["time_per_token_s"]
    est = estimate("ddp", params=2e7, num_nodes=3, max_steps=4, tokens_per_step=[1000, 500, 1000], tflops=0.24,
                   mfu=0.5)
    res = simulate(est.trace, {"name": "ok", "network": NET})
    assert trained(res, est.trace)["tokens"] == 4 * 2500
