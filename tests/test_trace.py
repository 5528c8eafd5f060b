"""The Trace: the contract's builder, save/load round trips, scaling, and matching checks."""

from __future__ import annotations

import json

import pytest

from exonet import Trace, TraceError, simulate
from exonet.trace import Collective, Compute, Step, Wait


def built() -> Trace:
    t = Trace(num_nodes=2, meta={"strategy": "hand-built"})
    for _ in range(2):
        for r in range(2):
            t.add_compute(r, 0.5, flops=1e9)
            cid = t.add_collective(r, "all_reduce", 1000, async_op=True)
            t.add_compute(r, 0.25)
            t.add_wait(r, cid)
            t.add_collective(r, "all_gather", 10, group=(0, 1))
            t.add_step(r)
    return t


def test_builder_records_the_contract_events_in_order():
    t = built()
    assert t.events[0][:5] == [Compute(0.5, 0.5, 1e9), Collective(0, "all_reduce", 1000, None, True),
                               Compute(0.25, 0.25, 0.0), Wait(0), Collective(1, "all_gather", 10, None, False)]
    assert isinstance(t.events[0][5], Step)
    assert t.num_steps(1) == 2 and t.payload_bytes_per_step(1) == [1010, 1010] and t.payload_bytes(0) == 2020
    t.validate()


def test_save_load_round_trip_is_exact(tmp_path):
    t = built()
    path = t.save(tmp_path / "t.jsonl")
    back = Trace.load(path)
    assert back.events == t.events and back.meta == t.meta and back.num_nodes == 2
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically, nothing left over


def test_truncated_and_corrupt_files_name_the_file(tmp_path):
    path = built().save(tmp_path / "t.jsonl")
    lines = path.read_text().splitlines()
    (tmp_path / "cut.jsonl").write_text("\n".join(lines[:-3]) + "\n")
    with pytest.raises(TraceError, match=r"cut\.jsonl.*truncated"):
        Trace.load(tmp_path / "cut.jsonl")
    (tmp_path / "bad.jsonl").write_text("\n".join([lines[0], '["x", 0, "oops"', *lines[1:]]) + "\n")
    with pytest.raises(TraceError, match=r"bad\.jsonl:2"):
        Trace.load(tmp_path / "bad.jsonl")
    with pytest.raises(TraceError, match="no such trace"):
        Trace.load(tmp_path / "missing.jsonl")
    (tmp_path / "config.json").write_text('{\n  "strategy": "DDP"\n}\n')  # valid JSON, the wrong file
    with pytest.raises(TraceError, match=r"config\.json: one JSON document, not an exonet trace .*trace\.jsonl"):
        Trace.load(tmp_path / "config.json")
    (tmp_path / "broken.jsonl").write_text('{"format": \n')
    with pytest.raises(TraceError, match=r"broken\.jsonl:1: not valid JSON"):
        Trace.load(tmp_path / "broken.jsonl")


def test_scaled_is_a_what_if_copy():
    t = built()
    big = t.scaled(bytes=10, compute=0.5)
    assert big.payload_bytes(0) == 10 * t.payload_bytes(0)
    assert [e.wall_s for e in big.events[0] if isinstance(e, Compute)] == [0.25, 0.125, 0.25, 0.125]
    assert t.payload_bytes(0) == 2020  # the original is untouched
    assert simulate(big, "datacenter").wall_clock_s < simulate(t.scaled(bytes=10), "datacenter").wall_clock_s


def test_mismatched_collectives_and_misuse_are_errors():
    t = Trace(2)
    t.add_collective(0, "all_reduce", 8)
    t.add_collective(1, "broadcast", 8)
    with pytest.raises(TraceError, match="all_reduce on rank 0 but broadcast on rank 1"):
        t.validate()
    with pytest.raises(ValueError, match="op must be one of"):
        t.add_collective(0, "allreduce", 8)
    with pytest.raises(ValueError, match="no async collective"):
        t.add_wait(0, 0)
    with pytest.raises(ValueError, match="not a member"):
        Trace(3).add_collective(2, "all_reduce", 8, group=(0, 1))


def test_num_nodes_counts_the_trainers_and_num_ranks_every_rank(tmp_path) -> None:
    """``num_nodes`` means trainers everywhere: a trace of 4 trainers and a server has 5 ranks; its file says
    num_ranks, and a file from before the rename (num_nodes = every rank) still loads as the same trace."""
    t = Trace(num_nodes=4, meta={"servers": 1})
    assert (t.num_nodes, t.num_ranks, len(t.events)) == (4, 5, 5)
    assert Trace(num_ranks=5, meta={"servers": 1}) == t
    t.add_collective(4, "send", 8, group=(0, 4))
    path = tmp_path / "t.jsonl"
    t.save(path)
    header = json.loads(path.read_text().splitlines()[0])
    assert header["num_ranks"] == 5 and "num_nodes" not in header
    assert Trace.load(path) == t
    old = path.read_text().replace('"num_ranks": 5', '"num_nodes": 5', 1)
    (tmp_path / "old.jsonl").write_text(old)
    assert Trace.load(tmp_path / "old.jsonl") == t
    with pytest.raises(ValueError, match=r"num_nodes=4 trainers and 1 servers are not num_ranks=4"):
        Trace(num_nodes=4, meta={"servers": 1}, num_ranks=4)
    with pytest.raises(ValueError, match=r"1 servers leave no trainer"):
        Trace(num_ranks=1, meta={"servers": 1})


def test_validate_matches_each_pairs_sends_with_its_receives_not_as_a_collective() -> None:
    """A ring of messages over three ranks: on pair (0, 1) rank 0 sends and rank 1 receives, which is a match,
    not a collective that differs between its members."""
    t = Trace(num_nodes=3)
    for r in range(3):
        t.add_collective(r, "send", 8, group=(r, (r + 1) % 3), async_op=True)
        t.add_collective(r, "recv", 8, group=((r - 1) % 3, r))
    t.validate()
    t.add_collective(0, "send", 8, group=(0, 1))
    with pytest.raises(TraceError, match=r"rank 0 sends 2 messages to rank 1, which receives 1"):
        t.validate()


def test_scans_count_each_run_of_equal_ranks_once_and_answer_as_rank_by_rank() -> None:
    """An estimate gives every rank rank 0's events: the payload, the store check and the next ids scan one run of
    equal ranks once, and give what a rank-by-rank scan gives, servers and unequal ranks included."""
    first = built().events[0]
    other = [Compute(1.0, 1.0), Collective(0, "all_reduce", 7), Collective(5, "send", 5, (1, 4)), Step()]
    rows = [first, list(first), list(first), other, list(first), [Collective(9, "all_reduce", 11), Step()]]
    t = Trace(num_nodes=5, meta={"servers": 1}, events=rows)
    assert [n for _, n in t.row_runs()] == [3, 1, 1, 1]
    assert [n for _, n in t.row_runs(1, 5)] == [2, 1, 1]
    assert t.payload_per_trainer() == sum(t.payload_bytes(r) for r in range(5)) / 5 == (4 * 2020 + 12) / 5
    assert t.payload_per_server() == t.payload_bytes(5) == 11
    assert [t.add_collective(r, "broadcast", 1) for r in range(6)] == [4, 4, 4, 6, 4, 10]
    copies = Trace(num_nodes=3, events=[built().events[0] for _ in range(3)])  # equal events, not the same objects
    assert [n for _, n in copies.row_runs()] == [1, 1, 1]
    assert copies.payload_per_trainer() == copies.payload_bytes(0) == 2020
