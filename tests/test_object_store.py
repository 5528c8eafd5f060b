"""The object store between peers: comm.put / comm.get for real, its trace, and its replay through [store]."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exonet import LocalTrainer
from exonet.errors import NodeFailure, TraceError
from exonet.estimate import estimate
from exonet.netsim import simulate
from exonet.netsim.store import with_store
from exonet.runtime.object_store import DirectoryStore
from exonet.scenario import Scenario
from exonet.strategies import DiLoCoStrategy, NoLoCoStrategy, OptimSpec, SparseLoCoStrategy, Strategy
from exonet.toy import Classifier, ShardFactory, linear_regressor, synthetic_regression
from exonet.trace import Collective, Trace

GBIT = 125_000_000  # bytes per second of 1 Gbit/s: a 1 Gbit/s link carries GBIT bytes in 1 s


def store_scenario(**store: str) -> Scenario:
    return Scenario.from_dict({"name": "bucket", "network": {"bandwidth": "1 Gbit/s", "latency": "1 ms"},
                               "store": {"latency": "20 ms", "throughput": "10 Gbit/s", **store}})


def one_put_two_gets(nbytes: int = GBIT) -> Trace:
    trace = Trace(3)
    trace.add_collective(0, "put", nbytes, key="a")
    for rank in (1, 2):
        trace.add_collective(rank, "get", nbytes, key="a")
    for rank in range(3):
        trace.add_step(rank)
    return trace


# ------------------------------------------------------------------ the replay
def test_a_get_waits_for_its_put_and_the_key_goes_up_once():
    """1 Gbit/s NICs, store latency 20 ms on top of 1 ms: the put lands at 1.021 s, each get then takes 1.021 s
    more (the store's 10 Gbit/s serves both readers at their NICs' rate)."""
    result = simulate(one_put_two_gets(), store_scenario())
    assert result.wall_clock_s == pytest.approx(2 * (1 + 0.021), abs=1e-6)
    assert result.servers == 1 and len(result.per_node) == 4  # the store is one more (serving) rank
    assert result.wire_bytes == [GBIT, 0, 0, 2 * GBIT]


def test_the_stores_throughput_and_a_peers_download_cap_bound_the_reads():
    """The store gives out 1 Gbit/s in all: two readers share it (2 s); a 0.5 Gbit/s download cap: 2 s alike."""
    shared = simulate(one_put_two_gets(), store_scenario(throughput="1 Gbit/s"))
    assert shared.wall_clock_s == pytest.approx(1.021 + 0.021 + 2.0, abs=1e-6)
    capped = simulate(one_put_two_gets(), store_scenario(download="500 Mbit/s"))
    assert capped.wall_clock_s == pytest.approx(1.021 + 0.021 + 2.0, abs=1e-6)


def test_the_rewritten_trace_serves_reads_in_each_readers_order():
    trace = Trace(2)
    for key in ("x", "y"):
        trace.add_collective(0, "put", 8, key=key)
    trace.add_collective(1, "get", 8, key="y")
    trace.add_collective(1, "get", 8, key="x")
    rewritten = with_store(trace)
    store = [(e.op, e.group) for e in rewritten.events[2] if isinstance(e, Collective)]
    assert store == [("recv", (0, 2)), ("recv", (0, 2)), ("send", (1, 2)), ("send", (1, 2))]
    assert rewritten.meta["servers"] == 1 and rewritten.num_nodes == 2
    assert with_store(Trace(2)).num_ranks == 2  # nothing to rewrite


def test_a_get_nobody_puts_and_a_key_put_twice_are_trace_errors():
    trace = Trace(2)
    trace.add_collective(1, "get", 8, key="never")
    with pytest.raises(TraceError, match="rank 1 gets key 'never', which no rank puts"):
        with_store(trace)
    twice = Trace(2)
    for rank in range(2):
        twice.add_collective(rank, "put", 8, key="k")
    with pytest.raises(TraceError, match="rank 1 puts key 'k', which rank 0 already put"):
        with_store(twice)


def test_store_ops_name_a_key_and_no_group_and_survive_a_file(tmp_path):
    with pytest.raises(ValueError, match="needs its key"):
        Trace(2).add_collective(0, "put", 8)
    with pytest.raises(ValueError, match="takes no group"):
        Trace(2).add_collective(0, "get", 8, group=[0, 1], key="k")
    trace = one_put_two_gets(64)
    trace.save(tmp_path / "t.json")
    loaded = Trace.load(tmp_path / "t.json")
    assert [(e.op, e.key) for e in loaded.events[1] if isinstance(e, Collective)] == [("get", "a")]
    assert loaded.payload_per_trainer() == pytest.approx(64 / 3)


def test_a_bad_store_region_is_named():
    with pytest.raises(Exception, match="store.region: 'mars' is not a region"):
        Scenario.from_dict({"name": "x", "network": {"bandwidth": "1 Gbit/s"}, "store": {"region": "mars"}})


# ------------------------------------------------------------- the real store
def test_the_directory_store_refuses_keys_outside_it_and_a_key_twice(tmp_path):
    store = DirectoryStore(tmp_path, rank=3, timeout_s=0.05)
    for key in ("../x", "/abs", "a/../b", "a b", ""):
        with pytest.raises(ValueError, match="rank 3"):
            store.put(key, torch.zeros(1))
    store.put("round1/rank3", torch.arange(4.0))
    assert torch.equal(store.get("round1/rank3", torch.empty(4)), torch.arange(4.0))
    with pytest.raises(ValueError, match="already in the store"):
        store.put("round1/rank3", torch.zeros(4))
    with pytest.raises(TimeoutError, match="rank 3: key 'missing' was never put"):
        store.get("missing", torch.empty(1))
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="rank 3: cannot write key 'file/x'"):
        DirectoryStore(tmp_path, 3, 1.0).put("file/x", torch.zeros(1))


class NeverPut(Strategy):
    """Reads a key nobody writes."""

    def step(self) -> None:
        self.optimizer_step()
        self.comm.get("nobody/wrote/this", torch.empty(1))


def test_a_run_that_gets_a_key_never_put_ends_naming_the_key_and_the_rank():
    with pytest.raises(NodeFailure, match="comm.get on rank [01]: key 'nobody/wrote/this' was never put"):
        LocalTrainer(linear_regressor(), synthetic_regression(n=32)).fit(
            NeverPut(OptimSpec("sgd", lr=0.1)), num_nodes=2, max_steps=1, batch_size=4, progress=False, timeout_s=1)


@pytest.fixture(scope="module")
def transports():
    runs = {}
    for transport in ("all_gather", "store"):
        torch.manual_seed(0)
        model = Classifier(nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4)))
        runs[transport] = LocalTrainer(model, ShardFactory(n=128, dim=16, classes=4)).fit(
            SparseLoCoStrategy(OptimSpec("sgd", lr=0.05), H=2, top_k=3, chunk=4, transport=transport), num_nodes=3,
            max_steps=4, batch_size=8, shuffle=False, progress=False)
    return runs


def test_sparseloco_through_the_store_equals_its_all_gather_and_puts_each_message_once(transports):
    gathered, stored = transports["all_gather"], transports["store"]
    for a, b in zip(gathered.model.parameters(), stored.model.parameters()):
        assert torch.equal(a, b)
    message = next(e.nbytes for e in gathered.trace.events[0] if isinstance(e, Collective))
    for rank in range(3):
        ops = [(e.op, e.nbytes, e.key) for e in stored.trace.events[rank] if isinstance(e, Collective)]
        for r in (1, 2):
            assert ops[(r - 1) * 3] == ("put", message, f"sparseloco/round{r}/rank{rank}")
            assert sorted(k for op, _, k in ops[(r - 1) * 3 + 1:r * 3]) == [
                f"sparseloco/round{r}/rank{j}" for j in range(3) if j != rank]
    assert stored.trace.payload_per_trainer() == 2 * message
    sim = stored.simulate(store_scenario())
    assert sim.wire_bytes[:3] == [2 * message] * 3 and sim.wire_bytes[3] == 2 * 3 * 2 * message


def test_estimate_runs_the_store_transport_rank_by_rank():
    est = estimate("sparseloco:H=5,transport=store", params=1e6, num_nodes=4, max_steps=10, step_time=0.1)
    keys = [e.key for e in est.trace.events[2] if isinstance(e, Collective)]
    assert keys[0] == "sparseloco/round1/rank2" and len(keys) == 2 * 4
    result = simulate(est.trace, store_scenario())
    assert result.servers == 1 and result.wire_bytes[4] == 4 * 3 * result.wire_bytes[0]  # each message to 3 readers


@pytest.mark.parametrize("make", [
    lambda t: DiLoCoStrategy(OptimSpec("sgd", lr=0.05), H=2, transport=t),
    lambda t: DiLoCoStrategy(OptimSpec("sgd", lr=0.05), H=2, quantize_bits=2, transport=t),
    lambda t: NoLoCoStrategy(OptimSpec("sgd", lr=0.05), H=2, transport=t),
], ids=["diloco", "diloco-2bit", "noloco"])
def test_every_transport_gives_the_same_model(make):
    """DiLoCo (its all-reduce, or 2-bit all-gather), MuLoCo's exchange and NoLoCo's swap through the store, and
    NoLoCo's through a pair all-gather, equal the default: the same messages, another road."""
    def run(transport):
        torch.manual_seed(0)
        model = Classifier(nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4)))
        return LocalTrainer(model, ShardFactory(n=128, dim=16, classes=4)).fit(
            make(transport), num_nodes=4, max_steps=4, batch_size=8, shuffle=False, progress=False)

    default = "p2p" if make("store").name == "noloco" else "all_gather"
    others = ("store", "all_gather") if default == "p2p" else ("store",)
    base = run(default)
    for transport in others:
        other = run(transport)
        for a, b in zip(base.model.parameters(), other.model.parameters()):
            assert torch.allclose(a, b, rtol=0, atol=1e-6), transport
        ops = {e.op for events in other.trace.events for e in events if isinstance(e, Collective)}
        assert ops == ({"put", "get"} if transport == "store" else {"all_gather"})


def test_a_store_in_a_region_of_its_own_bills_every_read_and_no_upload():
    """A share-0 region holds no peer, only the store; its egress prices what the readers download."""
    scenario = Scenario.from_dict({
        "name": "bucket", "network": {"bandwidth": "1 Gbit/s", "latency": "1 ms"},
        "regions": [{"name": "internet", "share": 1.0}, {"name": "cloud", "share": 0.0, "egress": "0.09 $/GB"}],
        "links": [{"between": ["internet", "cloud"], "bandwidth": "1 Tbit/s", "latency": "25 ms"}],
        "store": {"region": "cloud", "latency": "30 ms"}})
    assert scenario.resolve(4, servers=1, store=True).region == ("internet",) * 3 + ("cloud",)
    result = simulate(one_put_two_gets(), scenario)
    assert result.cost == pytest.approx(2 * GBIT * 0.09 / 1e9, rel=1e-12)
    assert result.wall_clock_s == pytest.approx(2 * (1 + 0.025 + 0.030), abs=1e-6)


@pytest.fixture(scope="module")
def bucket(moto_s3):
    """The module's moto S3 server (conftest's ``moto_s3``) with a bucket for the peers' objects."""
    _, client = moto_s3
    client.create_bucket(Bucket="peers")
    return client


def test_sparseloco_through_an_s3_bucket_equals_its_all_gather(transports, bucket):
    torch.manual_seed(0)
    model = Classifier(nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4)))
    run = LocalTrainer(model, ShardFactory(n=128, dim=16, classes=4)).fit(
        SparseLoCoStrategy(OptimSpec("sgd", lr=0.05), H=2, top_k=3, chunk=4, transport="store"), num_nodes=3,
        max_steps=4, batch_size=8, shuffle=False, progress=False, object_store="s3://peers/exchange")
    for a, b in zip(transports["all_gather"].model.parameters(), run.model.parameters()):
        assert torch.equal(a, b)
    keys = sorted(o["Key"] for o in bucket.list_objects_v2(Bucket="peers")["Contents"])
    assert len(keys) == 2 * 3 and all(k.startswith("exchange/exonet-") for k in keys)
    assert sorted(k.split("/", 2)[2] for k in keys) == [f"sparseloco/round{r}/rank{j}" for r in (1, 2)
                                                        for j in range(3)]


def test_object_store_takes_an_s3_url_or_nothing():
    with pytest.raises(ValueError, match="object_store must be None or an s3://bucket/prefix URL"):
        LocalTrainer(linear_regressor(), synthetic_regression(n=32)).fit(
            NeverPut(OptimSpec("sgd", lr=0.1)), num_nodes=2, max_steps=1, batch_size=4, progress=False,
            object_store="/tmp/somewhere")


def test_describe_names_the_store_and_marks_its_defaults():
    assert ("store       latency 20 ms, throughput 10 Gbit/s, download 500 Mbit/s per peer, in rank 0's region "
            "(comm.put/get)") in store_scenario(download="500 Mbit/s").describe(2)
    bare = Scenario.from_dict({"name": "b", "network": {"bandwidth": "1 Gbit/s"}, "store": {"upload": "1 Gbit/s"}})
    assert ("store       latency 30 ms (default), throughput 100 Gbit/s (default), upload 1 Gbit/s per peer"
            in bare.describe(2))
    assert "store" not in Scenario.load("datacenter").describe(2)
