"""Properties of the two file formats users hand to exonet: traces (JSON lines) and scenarios (TOML).

Hypothesis writes random files and mutations of valid ones. Every input either loads, or raises
``TraceError``/``ScenarioError`` whose message starts with the file's path (and, for a trace, names
a line of the file when it gives one); nothing else escapes. A trace that loads holds only checked
values, simulates (or raises TraceError, for collectives that do not match), and its Chrome trace is
strict JSON. A scenario that loads resolves for 1 to 4 nodes and replays a small trace, or raises
ScenarioError naming the file.

They live in the package, not in tests/, so that ``python -m exonet.bench fuzz`` (a random search) and
tests/test_fuzz_files.py (a fixed-seed round in CI) run the same strategies and checks from any install.
Hypothesis is a dev extra: importing this module without it fails.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from exonet import Scenario, ScenarioError, Trace, TraceError, simulate
from exonet.bench.fuzz import Property
from exonet.scenario.schema import ALGORITHMS, COMPUTE_MODES, EVENT_KINDS, JITTERS, SHARING
from exonet.trace import OPS, Collective, Compute

SIM_SCENARIO = Scenario.from_dict({"name": "fuzz", "network": {"bandwidth": "8 Mbit/s", "latency": "1 ms"}})

# ------------------------------------------------------------------ values a field may hold
WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 8), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([10**400, -0.0, 1e400, 0.5, 2**63]),
    st.text(max_size=6), st.sampled_from([*OPS, "c", "x", "w", "s", "float32"]),
    st.lists(st.integers(-2, 6), max_size=5), st.just({}), st.just([[0]]),
)


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in a file that must be strict JSON")
    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------ traces
@st.composite
def valid_traces(draw: st.DrawFn) -> Trace:
    """A trace that replays: collectives in one global order, random groups, async ones waited on later."""
    n = draw(st.integers(1, 4))
    specs = draw(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 10**6),
                                    st.one_of(st.none(), st.sets(st.integers(0, n - 1), min_size=1)),
                                    st.booleans()), max_size=5))
    t = Trace(n, meta={"fuzz": True})
    for r in range(n):
        pending = []
        for op, size, group, async_op in specs:
            if group is not None and r not in group:
                continue
            t.add_compute(r, draw(st.floats(0, 2)))
            cid = t.add_collective(r, op, size, group=sorted(group) if group else None, async_op=async_op)
            if async_op:
                pending.append(cid)
        for cid in pending:
            t.add_wait(r, cid)
        t.add_step(r)
    return t


def mutate_line(draw: st.DrawFn, line: str) -> str:
    try:
        value = json.loads(line)
    except ValueError:
        return line
    if isinstance(value, list) and value:
        how = draw(st.sampled_from(["set", "drop", "append"]))
        i = draw(st.integers(0, len(value) - 1))
        if how == "set":
            value[i] = draw(WEIRD)
        elif how == "drop":
            del value[i]
        else:
            value.append(draw(WEIRD))
    elif isinstance(value, dict) and value:
        key = draw(st.sampled_from(sorted(value)))
        value[key] = draw(st.one_of(WEIRD, st.sampled_from([0, 1, 2, 5, 2**21, "3", True, 1.5])))
    return json.dumps(value)  # allow_nan: NaN and Infinity reach the file as Python writes them


@st.composite
def mutated_trace_files(draw: st.DrawFn) -> bytes:
    """A saved valid trace with 0-3 mutations: a field changed, dropped or added, lines dropped, repeated or
    swapped, the text cut short, a byte replaced."""
    with tempfile.TemporaryDirectory() as d:
        lines = draw(valid_traces()).save(Path(d) / "t.jsonl").read_text().splitlines()
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["field", "field", "field", "delete", "repeat", "swap", "garbage"]))
        if how == "field":
            lines[i] = mutate_line(draw, lines[i])
        elif how == "delete" and len(lines) > 1:
            del lines[i]
        elif how == "repeat":
            lines.insert(i, lines[i])
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif how == "garbage":
            lines.insert(i, draw(st.text(max_size=20)))
    data = ("\n".join(lines) + "\n").encode()
    how = draw(st.sampled_from(["none", "none", "cut", "byte"]))
    if how == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "byte" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
    return data


def rarely(draw: st.DrawFn, odds: int) -> bool:
    """True one time in ``odds`` (not at 0, where Hypothesis draws most often)."""
    return draw(st.integers(0, odds - 1)) == odds // 2


def usually(valid: st.SearchStrategy, wrong: st.SearchStrategy = WEIRD, odds: int = 12) -> st.SearchStrategy:
    """``valid``, except one time in ``odds`` ``wrong``."""
    return st.integers(0, odds - 1).flatmap(lambda i: wrong if i == odds // 2 else valid)


@st.composite
def random_trace_files(draw: st.DrawFn) -> bytes:
    """A header, events built field by field (each field usually valid) and a footer, each sometimes malformed."""
    n = draw(usually(st.integers(1, 4)))
    header = {"format": "exonet-trace", "version": draw(usually(st.just(1))), "num_nodes": n,
              "meta": draw(usually(st.sampled_from([{}, {"a": 1}, None]), st.sampled_from(["m", [1]])))}
    k = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 4 else 2
    rank = usually(st.integers(0, k - 1))
    seconds = usually(st.floats(0, 5))
    group = usually(st.one_of(st.none(), st.lists(st.integers(0, k - 1), min_size=1, max_size=k)))
    fields = {
        "c": st.tuples(rank, seconds, seconds, usually(st.floats(0, 1e12))),
        "x": st.tuples(rank, usually(st.integers(0, 3)), usually(st.sampled_from(OPS)), usually(st.integers(0, 10**6)),
                       group, usually(st.sampled_from([0, 1])), usually(st.just("float32")),
                       usually(st.one_of(st.none(), st.floats(0, 5))), usually(st.one_of(st.none(), st.floats(0, 5)))),
        "w": st.tuples(rank, usually(st.integers(0, 3))),
        "s": st.tuples(rank),
    }
    kinds = st.sampled_from(sorted(fields))
    events = []
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(usually(kinds))
        rest = (list(draw(fields[kind])) if isinstance(kind, str) and kind in fields
                else draw(st.lists(WEIRD, max_size=9)))
        if rarely(draw, 10):
            rest = rest[:-1] if draw(st.booleans()) else [*rest, draw(WEIRD)]
        events.append([kind, *rest])
    footer = {"end": draw(usually(st.just(True))), "events": draw(usually(st.just(len(events))))}
    lines = [json.dumps(header), *(json.dumps(e) for e in events), json.dumps(footer)]
    return ("\n".join(lines) + "\n").encode()


def check_trace_file(data: bytes, folder: Path) -> None:
    path = folder / "fuzz.jsonl"
    path.write_bytes(data)
    try:
        trace = Trace.load(path)
    except TraceError as exc:
        message = str(exc)
        assert message.startswith(str(path)), message
        line = re.match(re.escape(str(path)) + r":(\d+):", message)
        if line:
            assert 1 <= int(line.group(1)) <= max(1, len(data.splitlines())), message
        return
    everyone = range(trace.num_ranks)
    for rank, events in enumerate(trace.events):
        for e in events:
            if isinstance(e, Compute):
                assert all(math.isfinite(x) and x >= 0 for x in (e.wall_s, e.cpu_s, e.flops)), e
            elif isinstance(e, Collective):
                assert isinstance(e.nbytes, int) and e.nbytes >= 0 and e.op in OPS, e
                if e.group is not None:
                    assert list(e.group) == sorted(set(e.group)) and set(e.group) < set(everyone) and rank in e.group
    try:
        result = simulate(trace, SIM_SCENARIO)
    except TraceError as exc:  # loads, but its collectives do not match across members
        assert str(exc).startswith("trace:"), exc
        return
    strict_json(result.to_chrome_trace(folder / "chrome.json").read_text())


# ------------------------------------------------------------------ scenarios
RATES = usually(st.sampled_from(["1 Gbit/s", "100 Mbit/s", "12.5 MB/s", "8 Mbit/s", "1 Gbps", "1e3 Mbit/s"]),
                st.sampled_from(["0 Mbit/s", "fast", "-1 Gbit/s", "1 Gbit", "1e400 Gbit/s", "nan Mbit/s", 5]))
TIMES = usually(st.sampled_from(["0 s", "1 ms", "30 ms", "200 us", "1.5 s", "0.5 ms"]),
                st.sampled_from(["-1 ms", "soon", "1 m", "inf s", 3]))
SIZES = usually(st.sampled_from(["4 MiB", "64 KiB", "1 MB"]), st.sampled_from(["0 MiB", "-4 MiB", "4 Mib", "big"]))
FRACTIONS = usually(st.sampled_from([0.25, 0.5, 1.0, 0.75]), st.one_of(st.sampled_from([0.0, 1.5, -0.5, math.nan]),
                                                                     st.floats(0, 1)))
RANKS = usually(st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
                st.lists(st.integers(-1, 5), max_size=4))


def _maybe(draw: st.DrawFn, table: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in table.items() if draw(st.booleans())}


def _ranks_or_share(draw: st.DrawFn) -> dict[str, Any]:
    """Exactly one of ``ranks`` and ``share`` (both or neither one time in ten)."""
    choice = draw(st.sampled_from(["ranks"] * 5 + ["share"] * 4 + ["both"]))
    out = {}
    if choice in ("ranks", "both"):
        out["ranks"] = draw(RANKS)
    if choice in ("share", "both"):
        out["share"] = draw(FRACTIONS)
    return out


@st.composite
def scenario_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A scenario document: optional keys present or not, each value usually meaningful, sometimes wrong."""
    network = {"bandwidth": draw(RATES)} if draw(usually(st.just(True), st.just(False))) else {}
    network |= _maybe(draw, {
        "uplink": draw(RATES), "downlink": draw(RATES), "latency": draw(TIMES),
        "collective": draw(usually(st.sampled_from(["ring", "tree", "star", "direct", "halving_doubling"]),
                                   st.just("rnig"))),
        "sharing": draw(usually(st.sampled_from(SHARING), st.just("fair"))), "efficiency": draw(FRACTIONS),
        "tcp_window": draw(SIZES),
        "algorithms": {op: draw(usually(st.sampled_from(ALGORITHMS[op]), st.just("nope")))
                       for op in draw(st.sets(st.sampled_from(OPS)))},
    })
    doc: dict[str, Any] = {"name": draw(usually(st.sampled_from(["s", "two regions"]), st.sampled_from(["", 3]))),
                           "network": network}
    if rarely(draw, 20):
        del doc[draw(st.sampled_from(["name", "network"]))]
    if draw(st.booleans()):
        mode = draw(usually(st.sampled_from(COMPUTE_MODES), st.just("gpu")))
        doc["compute"] = {"mode": mode,
                          **_maybe(draw, {"tflops": draw(usually(st.just(989.0), st.sampled_from([0.0, -1.0]))),
                                          "mfu": draw(FRACTIONS)})}
    if draw(st.booleans()):
        doc["stragglers"] = {"jitter": draw(usually(st.sampled_from(JITTERS), st.just("gauss"))),
                             **_maybe(draw, {"sigma": draw(usually(st.sampled_from([0.1, 0.0, 3.0]), st.just(-0.1))),
                                             "seed": draw(usually(st.integers(0, 3), st.just(-1)))})}
    names = draw(st.lists(st.sampled_from(["us", "eu", "asia"]), max_size=3, unique=True))
    if names:
        doc["regions"] = [{"name": name, **_ranks_or_share(draw)} for name in names]
        doc["links"] = [{"between": [a, b], "bandwidth": draw(RATES), **_maybe(draw, {"latency": draw(TIMES)})}
                        for i, a in enumerate([*names, "default"]) for b in [*names, "default"][i + 1:]
                        if draw(usually(st.just(True), st.just(False)))]
    if draw(st.booleans()):
        doc["nodes"] = [{**_ranks_or_share(draw), "speed": draw(usually(st.sampled_from([0.5, 2.0]), st.just(0.0))),
                         **_maybe(draw, {"uplink": draw(RATES)})}]
    if draw(st.booleans()):
        doc["events"] = []
        for _ in range(draw(st.integers(1, 2))):
            kind = draw(usually(st.sampled_from(EVENT_KINDS), st.just("late")))
            windows: list[dict[str, Any]] = (
                [{"from_step": 0, "to_step": 2}, {"from_step": 1, "to_step": 1}, {"to_step": 3}]
                if draw(st.booleans()) else
                [{"from_s": 0.0, "to_s": 0.5}, {"from_s": "1 ms", "to_s": "2 s"}, {"to_s": -1.0}])
            window = draw(st.sampled_from(windows))
            factor = {"factor": draw(usually(st.just(4.0), st.sampled_from([0.0, math.inf])))} if kind != "down" else {}
            doc["events"].append({"kind": kind, **_ranks_or_share(draw), **window, **factor})
    if rarely(draw, 10):
        doc[draw(st.sampled_from(["netwrok", "extra"]))] = 1
    return doc


def to_toml(doc: dict[str, Any]) -> str:
    """A document as TOML: scalars first, then [tables], then [[arrays of tables]] (enough for the schema)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        if isinstance(v, (int, str)):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"

    def table(header: str, body: dict[str, Any]) -> list[str]:
        out = [header] if header else []
        out += [f"{k} = {value(v)}" for k, v in body.items() if not isinstance(v, dict)]
        for k, v in body.items():
            if isinstance(v, dict):
                out += table(f"[{header.strip('[]') + '.' if header else ''}{k}]", v)
        return out

    lines = [f"{k} = {value(v)}" for k, v in doc.items() if not isinstance(v, (dict, list)) or
             (isinstance(v, list) and not all(isinstance(x, dict) for x in v))]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines += table(f"[{k}]", v)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for item in v:
                lines += [f"[[{k}]]", *table("", item)]
    return "\n".join(lines) + "\n"


@st.composite
def scenario_files(draw: st.DrawFn) -> bytes:
    """A scenario document as TOML, sometimes with its text damaged (a cut, a byte replaced, a line dropped)."""
    text = to_toml(draw(scenario_docs())).encode()
    how = draw(st.sampled_from(["none", "none", "none", "cut", "byte", "line"]))
    if how == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif how == "byte" and text:
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + bytes([draw(st.integers(0, 255))]) + text[i + 1:]
    elif how == "line":
        lines = text.splitlines()
        if lines:
            del lines[draw(st.integers(0, len(lines) - 1))]
        text = b"\n".join(lines) + b"\n"
    return text


def _small_trace(n: int) -> Trace:
    t = Trace(n)
    for r in range(n):
        for op in ("all_reduce", "broadcast", "all_gather"):
            t.add_compute(r, 0.01)
            t.add_collective(r, op, 10_000)
        t.add_step(r)
    return t


def check_scenario_file(data: bytes, folder: Path) -> None:
    path = folder / "fuzz.toml"
    path.write_bytes(data)
    try:
        scenario = Scenario.load(str(path))
    except ScenarioError as exc:
        message = str(exc)
        assert message.startswith(str(path)), message
        if "malformed TOML" in message:
            assert re.search(r"line \d+", message), message
        return
    for n in range(1, 5):
        try:
            scenario.resolve(n)
            result = simulate(_small_trace(n), scenario)
        except ScenarioError as exc:
            assert str(path) in str(exc), exc
            continue
        assert math.isfinite(result.wall_clock_s) and result.wall_clock_s >= 0, result


# ------------------------------------------------------------------ what the bench and the tests run
# name: (strategy, check, share of a round's examples); the shares are the 10,000-example round's 4:3:3.
PROPERTIES: dict[str, Property] = {
    "trace mutations": Property(mutated_trace_files(), check_trace_file, 0.4),
    "trace events": Property(random_trace_files(), check_trace_file, 0.3),
    "scenario": Property(scenario_files(), check_scenario_file, 0.3),
}
