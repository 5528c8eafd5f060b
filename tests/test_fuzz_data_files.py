"""Fuzzing the JSON files exonet reads from data someone else may have written: shard indexes
(``index.json``, from a folder and through the S3 store) and a run directory's ``config.json``.

Valid files are mutated (seeded): a value anywhere in the document replaced by an odd one, a key
dropped or added, a list item dropped or repeated, a shard's file renamed to a path that leads out of
its folder; or the text cut, a byte replaced, nesting past Python's recursion limit, an integer too
long to parse. Each file either loads, and then reads (a shard missing or of the wrong size is an
OSError naming it), or raises a ValueError whose message starts with the file's path (``TraceError``
for a run's files). The loaders build plain dicts and lists from JSON, so nothing in a file can run
code; what is checked is that nothing is written or deleted outside the cache folder: the served
files and a file beside them stay as they were, and the cache holds only its own shards.

The quick variant runs 1,000 files; the slow one 10,000 in all (about 10 s: the loaders are pure
functions, the time goes to writing each file) and prints the count and the time.
"""

from __future__ import annotations

import copy
import json
import random
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from exonet.data import S3Dataset, write_shards
from exonet.data.store import S3Store
from exonet.errors import TraceError
from exonet.rundir import incomplete, load_run, read_config
from exonet.trace import Trace

COUNTS = {"index, folder": 3500, "index, S3": 3500, "config.json": 3000}  # 10,000 in all
ODD = [None, True, False, 0, -1, 1, 2, 3, 4, 63, 64, 65, 2**63, -(2**70), 1.5, float("nan"), float("inf"), "",
       "x", "float32", "bfloat16", "qint8", "int4", "tensor", "dict", "../x", "/etc/passwd", "a/b", "a\\b", "..",
       "x\0y", "C:x", [], [0], [1, 2], [-1], [2**40, 2**40], {}, {"a": 1}]
NAMES = ["../escaped", "/tmp/exonet-fuzz-escaped", "..", ".", "", "sub/shard", "sub\\shard", "C:shard", "x\0y",
         "shard-00000.bin", "index.json", ".hidden"]


def samples() -> list[Any]:
    """Three structures and five dtypes, bfloat16 and a scalar field among them."""
    g = torch.Generator().manual_seed(0)
    return [
        [(torch.randn(3, generator=g), i % 4) for i in range(10)],
        [{"x": torch.randn(2, 2, generator=g).to(torch.bfloat16), "ok": torch.tensor(i % 2 == 0)} for i in range(7)],
        [torch.arange(i, i + 5, dtype=torch.int16) for i in range(9)],
    ]


# ------------------------------------------------------------------ mutations
def pick(doc: Any, rng: random.Random) -> tuple[Any, Any]:
    """A random place below the root of a JSON document, as (container, key): a walk down that stops at each
    level one time in three (and at a leaf)."""
    parent = doc
    while True:
        keys = list(parent) if isinstance(parent, dict) else list(range(len(parent)))
        if not keys:
            return None, None
        key = rng.choice(keys)
        child = parent[key]
        if not isinstance(child, (dict, list)) or not child or rng.random() < 1 / 3:
            return parent, key
        parent = child


def mutate(doc: Any, rng: random.Random, names: list[str]) -> bytes:
    """A copy of ``doc`` changed in one to three places, as bytes; sometimes damaged as text."""
    doc = json.loads(json.dumps(doc))
    for _ in range(rng.randint(1, 3)):
        parent, last = pick(doc, rng)
        if parent is None:
            break
        how = rng.choice(["odd", "odd", "odd", "name", "drop", "add", "repeat"])
        if how == "odd":
            parent[last] = copy.deepcopy(rng.choice(ODD))
        elif how == "name":
            parent[last] = rng.choice(names)
        elif how == "drop":
            del parent[last]
        elif how == "add" and isinstance(parent, dict):
            parent[rng.choice(["extra", "file", "rows", "bytes"])] = rng.choice(ODD)
        elif how == "repeat" and isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
    data = json.dumps(doc).encode()  # NaN and Infinity reach the file as Python writes them
    damage = rng.choice(["none"] * 6 + ["cut", "byte", "deep", "long int"])
    if damage == "cut":
        data = data[: rng.randint(0, len(data))]
    elif damage == "byte" and data:
        i = rng.randrange(len(data))
        data = data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]
    elif damage == "deep":
        data = b"[" * 100_000 + b"]" * 100_000
    elif damage == "long int":
        data = data.replace(b"1", b"1" * 5000, 1)
    return data


# ------------------------------------------------------------------ a folder that must not change
def snapshot(root: Path, skip: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and skip not in p.parents}


class FakeS3:
    """An S3 client on a local folder (get_object only): the S3 store's download and cache path, without a server."""

    class Missing(Exception):
        response = {"Error": {"Code": "NoSuchKey"}}

    class Body:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def read(self) -> bytes:
            return self.data

        def iter_chunks(self, size: int):
            return (self.data[i:i + size] for i in range(0, len(self.data), size))

    def __init__(self, root: Path) -> None:
        self.root = root

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803 - boto3's names
        file = self.root / Bucket / Key
        if not file.resolve().is_relative_to(self.root.resolve()) or not file.is_file():
            raise self.Missing(Key)
        return {"Body": self.Body(file.read_bytes())}

    def list_objects_v2(self, **_: Any) -> dict[str, Any]:
        return {"KeyCount": 1}


def read_all(ds: S3Dataset) -> None:
    """Read every sample: a valid index must give the samples, or name a shard file that does not fit."""
    for i in range(len(ds)):
        try:
            ds[i]
        except (FileNotFoundError, OSError) as exc:
            assert re.search(r"(no such key|but missing|bytes, the index says)", str(exc)), exc
            return


def fuzz_index(kind: str, count: int, root: Path, rng: random.Random) -> int:
    bucket = root / "bucket"
    prefixes = []
    for k, data in enumerate(samples()):
        write_shards(data, bucket / f"d{k}", shard_size=3)
        prefixes.append(f"d{k}")
    (root / "beside").write_bytes(b"must stay")
    cache = root / "cache"
    cache.mkdir()
    targets = []  # (valid index, where the mutated one goes, the URL to read it from, the index as errors name it)
    for prefix in prefixes:
        folder = bucket / f"m{prefix}"
        folder.mkdir()
        for shard in (bucket / prefix).glob("shard-*.bin"):  # the shards, beside the mutated index
            (folder / shard.name).write_bytes(shard.read_bytes())
        url = f"s3://bucket/m{prefix}" if kind == "index, S3" else str(folder)
        targets.append((json.loads((bucket / prefix / "index.json").read_bytes()), folder / "index.json", url,
                        f"{url}/index.json"))
    before = snapshot(root, cache)
    ran = 0
    with pytest.MonkeyPatch.context() as patch:
        fake = FakeS3(root)
        patch.setattr(S3Store, "client", lambda self: fake)
        for _ in range(count):
            good, file, url, where = rng.choice(targets)
            file.write_bytes(mutate(good, rng, NAMES))
            ran += 1
            try:
                ds = S3Dataset(url, cache_dir=str(cache), cache_bytes=64)
            except ValueError as exc:
                assert str(exc).startswith(where + ":"), exc
                continue
            read_all(ds)
            del ds
        after = snapshot(root, cache)
    assert after.keys() >= before.keys() and all(after[k] == v for k, v in before.items())
    written = set(after) - set(before)
    assert all(re.fullmatch(r"bucket/md\d/(index\.json|shard-\d{5}\.bin)", p) for p in written), written
    for p in cache.rglob("*"):  # each process's own cache folder, with shards in it only
        assert p.parent == cache and p.name.startswith("exonet-shards-") or p.parent.parent == cache, p
    assert not Path("/tmp/exonet-fuzz-escaped").exists()
    return ran


CONFIG = {"params": 212, "num_nodes": 2, "max_steps": 3, "batch_size": 8, "minibatch_size": 8, "device_type": "cpu",
          "backend": "gloo", "seed": 0, "shuffle": True, "autocast": None, "val_interval": 0, "val_size": 256,
          "threads": 2, "checkpoint_interval": 0, "max_sim_time_s": None,
          "strategy": {"strategy": "DDPStrategy", "optim_spec": {"optimizer": "AdamW", "lr": 0.001},
                       "max_norm": None, "lr_scheduler_kwargs": {}, "overlap": True},
          "scenario": None, "run_id": "1cc302a554ab4c07a478b2c91e83416e"}


def fuzz_config(kind: str, count: int, root: Path, rng: random.Random) -> int:
    run = root / "run"
    run.mkdir()
    trace = Trace(2)
    for r in range(2):
        trace.add_compute(r, 0.1)
        trace.add_step(r)
    trace.save(run / "trace.jsonl")
    (run / "metrics.jsonl").write_text('{"step": 1, "train_loss": 1.0}\n{"end": true, "lines": 1}\n')
    (run / "status.json").write_text('{"complete": false, "real_time_s": 1.0}\n')
    (root / "beside").write_bytes(b"must stay")
    before = snapshot(root, root / "none")
    for _ in range(count):
        (run / "config.json").write_bytes(mutate(CONFIG, rng, NAMES))
        try:
            config = read_config(run)
            why = incomplete(run)  # exonet simulate's note on a run that did not finish: it names max_steps
        except TraceError as exc:
            assert str(exc).startswith(f"{run / 'config.json'}:"), exc
            continue
        assert isinstance(config, dict) and why.startswith("incomplete: it failed or was interrupted after 1 of ")
    (run / "config.json").write_text(json.dumps(CONFIG))
    assert load_run(run)[0] == CONFIG  # and the run loads whole
    after = snapshot(root, root / "none")
    after.pop("run/config.json")
    assert after == before
    return count


LOADERS: dict[str, Callable[[str, int, Path, random.Random], int]] = {
    "index, folder": fuzz_index, "index, S3": fuzz_index, "config.json": fuzz_config}


@pytest.fixture
def folder(tmp_path):
    """A folder in memory where there is one (/dev/shm: a file written in 40 us, not 1 ms), else tmp_path."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="exonet-fuzz-") as d:
        yield Path(d)


def fuzz(folder: Path, counts: dict[str, int]) -> int:
    """Run ``counts`` mutated files of each loader; returns how many ran."""
    total = 0
    for n, (kind, count) in enumerate(counts.items()):
        root = folder / f"{n}"
        root.mkdir()
        total += LOADERS[kind](kind, count, root, random.Random(n))
    return total


def test_mutated_indexes_and_configs_load_or_name_the_file(folder):
    assert fuzz(folder, {kind: count // 10 for kind, count in COUNTS.items()}) == 1000


@pytest.mark.slow
def test_ten_thousand_mutated_indexes_and_configs_load_or_name_the_file(folder):
    start = time.perf_counter()
    total = fuzz(folder, COUNTS)
    print(f"fuzzed {total} files in {time.perf_counter() - start:.1f} s")
    assert total >= 10_000
