"""Properties of what a resume reads back: node files, latest.json and config.json of a checkpointed run.

As ``exonet.bench._fuzz_files`` does for traces and scenarios, Hypothesis damages a valid run directory
(one made by exonet's own writers, ``exonet.runtime.testing.write_checkpoint``): a field of a file changed,
dropped or given a value that would run code when loaded; a node file's bytes cut or replaced; files
swapped, copied over each other or removed. Then the parent's checks (``load_latest``) and each node's
load (``load_node`` into a fresh model and strategy) run in this process, without a fit. Every example
either resumes, or raises a TraceError (or ValueError) that names a file of the run, the damaged one
when one file was damaged; no code runs (a payload would create a marker file) and nothing is written
outside the run directory.

In the package so that ``python -m exonet.bench fuzz`` and tests/test_fuzz_checkpoints.py run the same
properties from any install; Hypothesis is a dev extra.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from hypothesis import strategies as st

from exonet import TraceError
from exonet.bench.fuzz import Property
from exonet.communicator import Communicator
from exonet.runtime.checkpoint import LATEST, load_latest, load_node, node_file
from exonet.runtime.testing import RunsCode, write_checkpoint
from exonet.strategies import DDPStrategy, NodeContext
from exonet.toy import tiny_mlp

K = 2
STEPS = 4  # the base run's checkpoint is step-00000004


NAMES = st.sampled_from(["../x", "/etc/passwd", "step-00000004/../..", "", ".", "..", "a\\b", "C:x", "x\0y",
                         "step-00000004", "step-00000005", "latest.json", "node-0.pt"])
WEIRD = st.one_of(st.none(), st.booleans(), st.integers(-3, 8), st.sampled_from([2**70, -(2**63), 10**400]),
                  st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), NAMES,
                  st.lists(st.integers(-2, 6), max_size=4), st.just({}), st.just({"0": 1.0, "1": "x"}))


def _places(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths to the values inside a node file's state (long sequences: their first two items only)."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _places(v, (*path, k))
    elif isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        for i, v in enumerate(value[:2] if len(value) > 8 else value):
            out += _places(v, (*path, i))
    return out


def _replace(value: Any, path: tuple, new: Any, drop: bool) -> Any:
    """``value`` with the item at ``path`` set to ``new`` (or dropped from its dict or list)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        out = dict(value)
        if drop and not rest:
            out.pop(head, None)
        else:
            out[head] = _replace(value[head], rest, new, drop)
        return out
    items = list(value)
    if drop and not rest:
        del items[head]
    else:
        items[head] = _replace(items[head], rest, new, drop)
    return type(value)(items) if isinstance(value, tuple) else items


# ------------------------------------------------------------------ damage, one kind per generator
# Each returns (what it damages, a function applying the damage to a copy of the base run).
Damage = tuple[str, Callable[[Path, Path], None]]


def _node(run: Path, rank: int) -> Path:
    return node_file(run / "checkpoints" / "step-00000004", rank)


@st.composite
def node_states(draw: st.DrawFn) -> Damage:
    """A node file saved again with one to three of its values changed, dropped, or made code."""
    rank = draw(st.integers(0, K - 1))
    changes = draw(st.lists(st.tuples(st.integers(0, 10**6), st.booleans(), st.randoms(use_true_random=False)),
                            min_size=1, max_size=3))

    def damage(run: Path, marker: Path) -> None:
        file = _node(run, rank)
        state = torch.load(file, weights_only=True)
        for pick, drop, rng in changes:
            places = _places(state)
            path = places[pick % len(places)]
            state = _replace(state, path, _value_from(rng, marker), drop and bool(path))
        torch.save(state, file)

    return f"checkpoints/step-00000004/node-{rank}.pt", damage


def _value_from(rng: random.Random, marker: Path) -> Any:
    """``_value`` drawn from a seeded Random (the state's shape is known only once the file is read)."""
    kind = rng.choice(["weird", "weird", "tensor", "code"])
    if kind == "code":
        return RunsCode(marker)
    if kind == "tensor":
        shape = rng.choice([(), (0,), (3,), (2, 2), (64, 8), (625,)])
        return torch.zeros(shape, dtype=rng.choice([torch.float32, torch.float64, torch.int64, torch.uint8]))
    return rng.choice([None, True, False, -1, 0, 3, 2**70, -(2**63), 1.5, math.nan, math.inf, "x", "", "../x",
                       [], [1, 2], {}, {"0": 1.0}, (1,), ("a", None)])


@st.composite
def node_bytes(draw: st.DrawFn) -> Damage:
    """A node file's bytes cut short, a byte replaced, a run of bytes overwritten, or a code payload's pickle."""
    rank = draw(st.integers(0, K - 1))
    how = draw(st.sampled_from(["cut", "byte", "span", "pickle", "zip with code"]))
    where, size, fill = draw(st.integers(0, 10**6)), draw(st.integers(1, 64)), draw(st.integers(0, 255))

    def damage(run: Path, marker: Path) -> None:
        file = _node(run, rank)
        data = file.read_bytes()
        i = where % len(data)
        if how == "cut":
            data = data[:i]
        elif how == "byte":
            data = data[:i] + bytes([fill]) + data[i + 1:]
        elif how == "span":
            data = data[:i] + bytes([fill]) * size + data[i + size:]
        elif how == "pickle":
            import pickle

            data = pickle.dumps({"format": 2, "model": RunsCode(marker)})
        if how == "zip with code":
            torch.save({**torch.load(file, weights_only=True), "rng": {"torch": RunsCode(marker)}}, file)
        else:
            file.write_bytes(data)

    return f"checkpoints/step-00000004/node-{rank}.pt", damage


def _json_damage(name: str, fields: st.SearchStrategy) -> st.SearchStrategy[Damage]:
    @st.composite
    def damaged(draw: st.DrawFn) -> Damage:
        how = draw(st.sampled_from(["set", "set", "set", "drop", "add", "text", "not a dict"]))
        key, value = draw(fields), draw(WEIRD)
        where, fill = draw(st.integers(0, 10**4)), draw(st.integers(0, 255))

        def damage(run: Path, marker: Path) -> None:
            file = run / name
            record = json.loads(file.read_text())
            if how == "set":
                record[key] = value
            elif how == "drop":
                record.pop(key, None)
            elif how == "add":
                record["extra"] = value
            elif how == "not a dict":
                record = value
            text = json.dumps(record).encode()  # allow_nan: NaN and Infinity reach the file as Python writes them
            if how == "text":
                i = where % len(text)
                text = text[:i] + bytes([fill]) + text[i + 1:]
            file.write_bytes(text)

        return name, damage

    return damaged()


@st.composite
def file_moves(draw: st.DrawFn) -> Damage:
    """One or two moves: node files swapped, one copied over the other, or a file of the checkpoint removed."""
    moves = draw(st.lists(st.tuples(st.sampled_from(["swap", "copy", "remove"]),
                                    st.sampled_from(["node-0.pt", "node-1.pt", "trace.jsonl", "metrics.jsonl",
                                                     "../latest.json"])), min_size=1, max_size=2))

    def damage(run: Path, marker: Path) -> None:
        step = run / "checkpoints" / "step-00000004"
        a, b = node_file(step, 0), node_file(step, 1)
        for how, victim in moves:
            if not (a.exists() and b.exists()) or how == "remove":
                (step / victim).unlink(missing_ok=True)
            elif how == "swap":
                a.rename(step / "x")
                b.rename(a)
                (step / "x").rename(b)
            else:
                shutil.copy(a, b)

    return "", damage


# ------------------------------------------------------------------ the check
def _files(folder: Path, leave_out: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file() and leave_out not in p.parents}


def resume_reads(run: Path) -> None:
    """What a resume reads, as the parent and then each node read it (nodes without a network)."""
    resume = load_latest(run, K)
    for rank in range(K):
        comm = Communicator(rank, K, torch.device("cpu"))
        model, strategy = tiny_mlp(), DDPStrategy()
        strategy.setup(model, comm, NodeContext(rank, K, 8, 0, torch.device("cpu")))
        load_node(resume.folder, rank, model, strategy)


@contextmanager
def _kept_rng() -> Iterator[None]:
    """load_node sets the process's RNG states from the file: put this process's back afterwards."""
    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])


def base_run(folder: Path) -> Path:
    """The run every example in ``folder`` damages a copy of: K nodes and one checkpoint, made once by exonet's own
    writers (under ``folder/base``, which the check also holds unchanged)."""
    bases = folder / "base"
    if bases.exists():
        (run,) = bases.iterdir()
        return run
    bases.mkdir(parents=True)
    return write_checkpoint(bases, num_nodes=K, steps=STEPS)


def check(damaged: Damage, folder: Path) -> None:
    """Damage a copy of ``folder``'s base run and resume it: it resumes, or its error names the damaged file; no
    code runs and nothing outside the copy changes."""
    name, damage = damaged
    base = base_run(folder)
    (folder / "outside").mkdir(exist_ok=True)
    (folder / "outside" / "keep.txt").write_text("a file outside the run directory")
    run = shutil.copytree(base, folder / "run")
    marker = folder / "outside" / "ran"
    before = _files(folder, run)
    try:
        damage(run, marker)
        try:
            with warnings.catch_warnings(), _kept_rng():  # torch's warnings, about the nonsense it is given
                warnings.simplefilter("ignore")
                resume_reads(run)
        except (TraceError, ValueError) as exc:
            message = str(exc)
            assert message.startswith((f"{run}/", f"resume_from: {run}/")), message
            assert Path(name).name in message, message
        assert not marker.exists(), "loading ran code"
        assert _files(folder, run) == before, "a file outside the run directory changed"
    finally:
        shutil.rmtree(run)


def set_in_node(rank: int, path: tuple, value: Any) -> Damage:
    """One value of node ``rank``'s file set (a damage the search once drew, written out as a regression)."""
    def damage(run: Path, marker: Path) -> None:
        file = _node(run, rank)
        torch.save(_replace(torch.load(file, weights_only=True), path, value, False), file)

    return f"checkpoints/step-00000004/node-{rank}.pt", damage


# ------------------------------------------------------------------ what the bench and the tests run
# The shares are the 10,000-example round's (4,000 : 3,000 : 2,000 : 800 : 200).
PROPERTIES: dict[str, Property] = {
    "node state": Property(node_states(), check, 0.4),
    "node bytes": Property(node_bytes(), check, 0.3),
    "latest.json": Property(_json_damage(f"checkpoints/{LATEST}", st.sampled_from(["step", "dir", "run",
                                                                                    "references"])), check, 0.2),
    "config.json": Property(_json_damage("config.json", st.sampled_from(["run_id", "num_nodes"])), check, 0.08),
    "files": Property(file_moves(), check, 0.02),
}
