"""Validation cases: real exonet nodes on a shaped namespace network, and the same cases simulated.

A ``Case`` names a network (K nodes, a NIC rate, optionally one slow uplink or two
regions joined by one link) and a workload: a collective of some payload, a burst of
small collectives (where per-message cost dominates), or a short training run. Cases
sharing a network run on one ``Network``; the collective cases of a network run in
one set of node processes (one per namespace, gloo over the namespace interface,
env:// rendezvous), the training cases each as one ``fit`` under the torchrun path.

Measurements come from the nodes' own trace: each Collective's start_s/end_s, put on
one clock (CLOCK_MONOTONIC, which network namespaces share). A repetition's real time
is max over ranks of its last collective's end minus max over ranks of its first
collective's start (the simulator starts a collective when its last member issues it).
Each case runs one warm-up repetition (dropped) and ``repeats`` measured ones; the
median is reported. A training case's real time runs from the last node's start of
training to the last node's end of its final step; it is simulated with
``compute.mode = "wall"`` so both sides see the same compute spans.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

from exonet.scenario import Scenario
from exonet.trace import Collective, Compute, Event, Trace
from exonet.validate.netns import Namespaces, Network, NodeLink, address

STRATEGIES = ("ddp", "diloco", "sparta", "demo")
WORKER_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Case:
    """One validation case.

    Args:
        kind: "collective" (one op per repetition), "burst" (``count`` ops back to back) or "train".
        nodes: K, one namespace each.
        bandwidth: every NIC's rate, bit/s, each direction.
        op / nbytes: the collective and its payload as the trace counts it (``Trace.add_collective``).
        hetero: the last node's uplink runs at a quarter of ``bandwidth``.
        regions: two regions (first and second half of the ranks) joined by one link at
            ``bandwidth``; each rank i of the first half runs the op with rank i + K/2, all
            pairs at once, so every pair crosses the shared link.
        strategy / steps: the training run ("ddp", "diloco", "sparta", "demo") on the digits MLP.
    """

    kind: str
    nodes: int
    bandwidth: float
    op: str = "all_reduce"
    nbytes: int = 0
    count: int = 1
    repeats: int = 3
    hetero: bool = False
    regions: bool = False
    strategy: str = ""
    steps: int = 0

    @property
    def name(self) -> str:
        where = f"K={self.nodes} {self.bandwidth / 1e6:g}M"
        where += " hetero" if self.hetero else " 2-region" if self.regions else ""
        if self.kind == "train":
            return f"{self.strategy} {self.steps} steps, {where}"
        size = f"{self.nbytes / 1e6:g}MB" if self.nbytes >= 100_000 else f"{self.nbytes / 1e3:g}KB"
        burst = f" x{self.count}" if self.kind == "burst" else ""
        return f"{self.op} {size}{burst}, {where}"

    def network_key(self) -> tuple:
        return (self.nodes, self.bandwidth, self.hetero, self.regions)

    def links(self) -> list[NodeLink]:
        rate = self.bandwidth / 8
        nics = [NodeLink(rate) for _ in range(self.nodes)]
        if self.hetero:
            nics[-1] = NodeLink(rate / 4, rate)
        return nics

    def groups(self) -> list[tuple[int, ...]] | None:
        """The groups the op runs on (None: the whole world)."""
        if not self.regions:
            return None
        half = self.nodes // 2
        return [(i, i + half) for i in range(half)]

    def scenario(self, base: Scenario) -> Scenario:
        """``base`` set to this case's network: NIC rate, slow node, regions, wall-clock compute."""
        bw = f"{self.bandwidth:g} bit/s"
        changes: dict[str, Any] = {"bandwidth": bw, "compute": {"mode": "wall"}}
        if self.hetero:
            changes["nodes"] = [{"ranks": [self.nodes - 1], "uplink": f"{self.bandwidth / 4:g} bit/s",
                                 "downlink": bw}]
        if self.regions:
            half = self.nodes // 2
            changes["regions"] = [{"name": "a", "ranks": list(range(half))},
                                  {"name": "b", "ranks": list(range(half, self.nodes))}]
            changes["links"] = [{"between": ["a", "b"], "bandwidth": bw}]
        return base.replace(**changes)


@dataclass
class Measurement:
    """A case's real repetitions (seconds) and the trace of each, for the simulator."""

    case: Case
    real_s: list[float]
    traces: list[Trace] = field(repr=False)

    @property
    def real(self) -> float:
        return statistics.median(self.real_s)

    def simulate(self, scenario: Scenario) -> float:
        """Median simulated seconds of the repetitions under ``scenario`` (set to this case's network)."""
        from exonet.netsim import simulate

        scen = self.case.scenario(scenario)
        times = []
        for trace in self.traces:
            sim = simulate(trace, scen)
            times.append(sim.step_end_times[-1] if self.case.kind == "train" else sim.wall_clock_s)
        return statistics.median(times)


# ---------------------------------------------------------------- matrices
def network_cases(nodes: int, bandwidth: float, payload: int, repeats: int = 3, burst: int = 40,
                  big: bool = False) -> list[Case]:
    """The collectives on one network, sized from ``payload`` so each takes about the same time.

    all_reduce and reduce_scatter of ``payload``, all_gather of payload/K per rank, broadcast of
    payload/2, a burst of ``burst`` 4 KB all-reduces; with ``big`` also an all_reduce of 4x payload.
    """
    c = [Case("collective", nodes, bandwidth, "all_reduce", payload, repeats=repeats),
         Case("collective", nodes, bandwidth, "all_gather", payload // nodes, repeats=repeats),
         Case("collective", nodes, bandwidth, "reduce_scatter", payload, repeats=repeats),
         Case("collective", nodes, bandwidth, "broadcast", payload // 2, repeats=repeats),
         Case("burst", nodes, bandwidth, "all_reduce", 4096, count=burst, repeats=repeats)]
    if big:
        c.insert(1, Case("collective", nodes, bandwidth, "all_reduce", 4 * payload, repeats=repeats))
    return c


def ci_matrix() -> list[Case]:
    """The reduced matrix the test suite runs: K = 2 and 4, 10 and 40 Mbit/s, collectives, one DDP run.

    It leaves out the collectives the model does not claim (exonet.validate.calibrate.covered:
    reduce_scatter, and all_gather between two ranks), which the full matrix still shows.
    """
    cases = []
    for k in (2, 4):
        for bw, payload in ((10e6, 1_000_000), (40e6, 4_000_000)):
            cases += [c for c in network_cases(k, bw, payload, burst=30)
                      if c.op != "reduce_scatter" and not (k == 2 and c.op == "all_gather")]
    cases.insert(len(cases) // 2, Case("train", 4, 10e6, strategy="ddp", steps=20, repeats=1))
    return cases


def full_matrix() -> list[Case]:
    """The README matrix: K in {2, 4, 8} x {10, 50, 200, 1000} Mbit/s (payloads 1-64 MB), the four
    training runs (K=4), a slow node (one uplink at a quarter) and two regions contending for one link."""
    cases = []
    for k in (2, 4, 8):
        for bw, payload in ((10e6, 1_000_000), (50e6, 4_000_000), (200e6, 16_000_000), (1000e6, 64_000_000)):
            cases += network_cases(k, bw, payload, big=bw <= 50e6)
    cases += [Case("collective", 4, 50e6, "all_reduce", 4_000_000, hetero=True),
              Case("collective", 4, 50e6, "all_gather", 1_000_000, hetero=True),
              Case("collective", 4, 50e6, "all_reduce", 4_000_000, regions=True),
              Case("collective", 4, 50e6, "all_gather", 2_000_000, regions=True)]
    for strategy in STRATEGIES:
        cases.append(Case("train", 4, 10e6, strategy=strategy, steps=60, repeats=1))
    return cases


# ---------------------------------------------------------------- the parent side
def run_cases(cases: Sequence[Case], log: Callable[[str], None] = print) -> list[Measurement]:
    """Run every case for real (grouped by network, in the given order within a group)."""
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.network_key(), []).append(case)
    out: dict[Case, Measurement] = {}
    port = 29500
    for key, members in groups.items():
        first = members[0]
        region = [0] * first.nodes if not first.regions else [0] * (first.nodes // 2) + [1] * (first.nodes // 2)
        with Network(first.links(), region if first.regions else None,
                     first.bandwidth / 8 if first.regions else None) as net:
            comm_cases = [c for c in members if c.kind != "train"]
            if comm_cases:
                log(f"network K={first.nodes} {first.bandwidth / 1e6:g} Mbit/s: {len(comm_cases)} collective case(s)")
                for case, m in zip(comm_cases,
                                   _launch(net, first.nodes, {"cases": [asdict(c) for c in comm_cases]}, port)):
                    out[case] = m
                    log(f"  {case.name}: real {m.real:.4f} s (repetitions {', '.join(f'{t:.4f}' for t in m.real_s)})")
                port += 1
            for case in (c for c in members if c.kind == "train"):
                log(f"  training {case.name} ...")
                out[case] = _launch(net, first.nodes, {"train": asdict(case)}, port)[0]
                log(f"  {case.name}: real {out[case].real:.3f} s")
                port += 1
    return [out[c] for c in cases]


def _launch(net: Network, k: int, job: dict[str, Any], port: int) -> list[Measurement]:
    """Run ``job`` on one node process per namespace and turn their reports into measurements."""
    reports = launch_nodes(net, k, "exonet.validate.cases", job, port, torchrun="train" in job)
    if "train" in job:
        return [_train_measurement(Case(**job["train"]), reports)]
    return [_collective_measurement(Case(**c), [rep["cases"][i] for rep in reports])
            for i, c in enumerate(job["cases"])]


def launch_nodes(net: Namespaces, k: int, module: str, job: dict[str, Any], port: int,
                 torchrun: bool = False) -> list[Any]:
    """Run ``python -m module JOB_JSON OUT_DIR`` in every namespace (gloo on its interface, env://
    rendezvous at rank 0), wait for all, and return what each pickled to ``OUT_DIR/rank{r}.pkl``.

    A node that fails or outlives ``WORKER_TIMEOUT_S`` ends the run with its output's tail; no
    process is left running. ``torchrun``: the nodes see a torchrun job (``fit`` takes that path).
    """
    with tempfile.TemporaryDirectory(prefix="exonet-validate-") as tmp:
        spec = Path(tmp) / "job.json"
        spec.write_text(json.dumps(job))
        procs = []
        for rank in range(k):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(k), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR=address(0), MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=net.iface(rank),
                       OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
            if torchrun:
                env["TORCHELASTIC_RUN_ID"] = f"exonet-validate-{os.getpid()}-{port}"  # fit takes the torchrun path
            err = open(Path(tmp) / f"rank{rank}.err", "w")
            procs.append((subprocess.Popen([*net.exec_prefix(rank), sys.executable, "-m", module, str(spec), tmp],
                                           env=env, stdout=err, stderr=subprocess.STDOUT), err))
        try:
            deadline = time.monotonic() + WORKER_TIMEOUT_S
            while any(p.poll() is None for p, _ in procs):
                bad = [r for r, (p, _) in enumerate(procs) if p.poll() not in (None, 0)]
                if bad or time.monotonic() > deadline:
                    rank = bad[0] if bad else 0
                    why = (f"exited with {procs[rank][0].returncode}" if bad
                           else f"timed out after {WORKER_TIMEOUT_S:g} s")
                    tail = (Path(tmp) / f"rank{rank}.err").read_text()[-3000:]
                    raise RuntimeError(f"validate: node {rank} {why}:\n{tail}")
                time.sleep(0.05)
            bad = [r for r, (p, _) in enumerate(procs) if p.returncode]
            if bad:
                raise RuntimeError(f"validate: node {bad[0]} failed:\n"
                                   f"{(Path(tmp) / f'rank{bad[0]}.err').read_text()[-3000:]}")
        finally:
            for p, err in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(5)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                err.close()
        return [pickle.loads((Path(tmp) / f"rank{r}.pkl").read_bytes()) for r in range(k)]


def _collective_measurement(case: Case, per_rank: list[dict[str, Any]]) -> Measurement:
    """Real seconds and a replayable trace for each measured repetition (the warm-up is dropped)."""
    k = case.nodes
    real, traces = [], []
    for rep in range(1, case.repeats + 1):
        events: list[list[Event]] = []
        starts, ends = [], []
        for rank in range(k):
            base, reps = per_rank[rank]["base"], per_rank[rank]["reps"]
            evs = reps[rep]
            colls = [e for e in evs if isinstance(e, Collective)]
            starts.append(base + colls[0].start_s)
            ends.append(base + colls[-1].end_s)
            first = evs.index(colls[0])
            last = evs.index(colls[-1])
            events.append([e for e in evs[first:last + 1] if isinstance(e, (Collective, Compute))])
        real.append(max(ends) - max(starts))
        traces.append(Trace(k, {"case": case.name}, events))
    return Measurement(case, real, traces)


def _train_measurement(case: Case, per_rank: list[dict[str, Any]]) -> Measurement:
    begin = max(r["begin"] for r in per_rank)
    end = max(r["last_step"] for r in per_rank)
    trace = next(r["trace"] for r in per_rank if r.get("trace") is not None)
    return Measurement(case, [end - begin], [trace])


# ---------------------------------------------------------------- the node side
def timed_node(repeats: int, repetition: Callable[[Any, int], list[Event]], out: Path) -> None:
    """The node side of ``launch_nodes`` for a timed program: join the gloo group, run ``repetition(comm, rank)``
    ``repeats`` + 1 times between barriers (the first a warm-up), each returning its trace events, and pickle each
    one's start, end and events for the parent."""
    import torch
    import torch.distributed as dist

    from exonet.communicator import Communicator
    from exonet.runtime.rendezvous import leave_without_teardown

    rank, k = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=k, timeout=timedelta(seconds=600))
    comm = Communicator(rank, k, torch.device("cpu"))
    starts, ends, events = [], [], []
    comm.begin()
    for _ in range(repeats + 1):
        with comm.bookkeeping():
            dist.barrier()
        comm.take_events()
        starts.append(time.perf_counter())
        events.append(repetition(comm, rank))
        ends.append(time.perf_counter())
    dist.barrier()
    (out / f"rank{rank}.pkl").write_bytes(pickle.dumps({"starts": starts, "ends": ends, "events": events}))
    leave_without_teardown()


def _node_collectives(cases: list[dict[str, Any]], out: Path) -> None:
    """Run every collective case of one network in this node's process group; pickle the events."""
    import torch
    import torch.distributed as dist

    from exonet.communicator import Communicator
    from exonet.runtime.rendezvous import leave_without_teardown

    rank, k = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=k, timeout=timedelta(seconds=600))
    comm = Communicator(rank, k, torch.device("cpu"))
    base = time.perf_counter() - comm.now()
    results = []
    for spec in cases:
        case = Case(**spec)
        groups = case.groups()
        group = None
        if groups:
            comm.declare_groups(groups)
            group = next(g for g in groups if rank in g)
        size = len(group) if group else k
        elems = max(size, case.nbytes // 4 // size * size)  # reduce_scatter and all_to_all split dim 0 by the group
        tensor = torch.ones(elems)
        op = getattr(comm, case.op)
        comm.begin()
        reps = []
        for _ in range(case.repeats + 1):
            with comm.bookkeeping():
                dist.barrier()
            comm.take_events()
            for _ in range(case.count):
                op(tensor, group=group)
            reps.append(comm.take_events())
        results.append({"base": base, "reps": reps})
    dist.barrier()
    (out / f"rank{rank}.pkl").write_bytes(pickle.dumps({"cases": results}))
    leave_without_teardown()


def _strategy(name: str) -> Any:
    from exonet.study.quickstart import quickstart_strategies

    by_name = {key.split()[0].lower(): s for key, s in quickstart_strategies().items()}
    return by_name[name]


def _node_train(spec: dict[str, Any], out: Path) -> None:
    """One node of a training run (the torchrun path of ``fit``); records when training began and ended here."""
    from exonet import LocalTrainer
    from exonet.communicator import CommCore, Communicator
    from exonet.toy import digits, digits_mlp

    case = Case(**spec)
    marks: dict[str, float] = {}
    begin, mark_step = Communicator.begin, Communicator.mark_step

    def timed_begin(self: CommCore) -> None:
        marks["begin"] = time.perf_counter()
        begin(self)

    def timed_mark_step(self: CommCore) -> list[Event]:
        events = mark_step(self)
        marks["last_step"] = time.perf_counter()
        return events

    Communicator.begin, Communicator.mark_step = timed_begin, timed_mark_step  # type: ignore[method-assign]
    result = LocalTrainer(digits_mlp(), digits(train=True)).fit(
        _strategy(case.strategy), num_nodes=case.nodes, max_steps=case.steps, batch_size=16, seed=0,
        progress=False, device="cpu", val_interval=0)
    rank = int(os.environ["RANK"])
    report = dict(marks, trace=result.trace if rank == 0 else None)
    (out / f"rank{rank}.pkl").write_bytes(pickle.dumps(report))


if __name__ == "__main__":
    job = json.loads(Path(sys.argv[1]).read_text())
    if "train" in job:
        _node_train(job["train"], Path(sys.argv[2]))
    else:
        _node_collectives(job["cases"], Path(sys.argv[2]))
