"""exonet.data against a real S3-protocol server on loopback (moto's standalone server) and a folder.

The server is started by the fixture on 127.0.0.1 (port 0) and stopped after; node
processes reach it through AWS_ENDPOINT_URL, as they would reach a real endpoint.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from exonet import LocalTrainer
from exonet.data import S3Dataset, write_shards
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.toy import synthetic_classification, tiny_mlp

DATA = synthetic_classification(96, dim=8, classes=4)


@dataclass
class Server:
    endpoint: str
    client: Any  # a boto3 S3 client on the server


@pytest.fixture(scope="module")
def s3(moto_s3):
    """The module's moto server (conftest's ``moto_s3``) with a bucket holding DATA in 12 shards."""
    endpoint, client = moto_s3
    client.create_bucket(Bucket="exo")
    write_shards(DATA, "s3://exo/digits", shard_size=8)
    return Server(endpoint, client)


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_round_trip_and_index(s3):
    ds = S3Dataset("s3://exo/digits")
    assert len(ds) == 96 and all(_same(ds[i], DATA[i]) for i in range(96))
    index = json.loads(s3.client.get_object(Bucket="exo", Key="digits/index.json")["Body"].read())
    assert index["num_samples"] == 96 and len(index["shards"]) == 12
    assert [f["dtype"] for f in index["fields"]] == ["float32", "int64"]
    assert index["shards"][0]["bytes"] == 8 * 8 * 4 + 8 * 8  # 8 rows of 8 float32, then 8 int64 (64-aligned)


def test_each_node_reads_only_its_shards_and_together_everything(s3):
    ds = S3Dataset("s3://exo/digits")
    seen, samples = [], []
    for rank in range(3):
        part = ds.node_split(rank, 3)
        samples += [part[i] for i in range(len(part))]
        seen.append(part.fetched)
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # 32 samples = 4 whole shards each
    assert len(samples) == 96 and all(_same(s, DATA[i]) for i, s in enumerate(samples))


def test_fit_from_s3_in_node_processes(s3):
    ds = S3Dataset("s3://exo/digits")
    result = LocalTrainer(tiny_mlp(), ds, S3Dataset("s3://exo/digits")).fit(
        DDPStrategy(OptimSpec("adam", lr=0.02)), num_nodes=2, max_steps=12, batch_size=8, val_interval=12,
        val_size=32, progress=False, device="cpu", seed=0)
    local = LocalTrainer(tiny_mlp(),
                         lambda rank, k, train: torch.utils.data.Subset(DATA, range(rank * 48, rank * 48 + 48))
                         ).fit(DDPStrategy(OptimSpec("adam", lr=0.02)), num_nodes=2, max_steps=12, batch_size=8,
                               progress=False, device="cpu", seed=0)
    assert result.history["train_loss"] == pytest.approx(local.history["train_loss"], abs=1e-6)
    assert result.history["eval"][-1]["loss"] < result.history["train_loss"][0]


def test_missing_bucket_prefix_and_key_are_named(s3):
    with pytest.raises(FileNotFoundError, match=r"s3://nobucket: no such bucket \(endpoint http://127.0.0.1"):
        S3Dataset("s3://nobucket/digits")
    with pytest.raises(FileNotFoundError, match=r"s3://exo/nothere/index.json: no such key: nothing is stored "
                                                r"under the prefix s3://exo/nothere/"):
        S3Dataset("s3://exo/nothere")
    write_shards(DATA, "s3://exo/holed", shard_size=32)
    s3.client.delete_object(Bucket="exo", Key="holed/shard-00001.bin")
    ds = S3Dataset("s3://exo/holed")
    assert _same(ds[0], DATA[0])
    with pytest.raises(FileNotFoundError, match=r"s3://exo/holed/shard-00001.bin: no such key"):
        ds[40]


class DropFirst:
    """A TCP proxy to the server that closes the first ``drops`` connections at once: a transient failure."""

    def __init__(self, target: str, drops: int) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target, self.drops, self.dropped = (host, int(port)), drops, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.dropped < self.drops:
                self.dropped += 1
                client.recv(65536)  # the request arrives, the connection dies before any answer
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_a_transient_failure_is_retried_once_with_backoff(s3, caplog):
    proxy = DropFirst(s3.endpoint, drops=1)
    try:
        with pytest.raises(OSError, match=r"s3://exo/digits/index.json: still failing after 0 retries"):
            S3Dataset("s3://exo/digits", endpoint_url=proxy.url, retries=0)
        assert proxy.dropped == 1
        proxy.drops = 2
        ds = S3Dataset("s3://exo/digits", endpoint_url=proxy.url, retries=3, backoff_s=0.01)
        assert proxy.dropped == 2 and _same(ds[95], DATA[95])
        assert "retry 1 of 3" in caplog.text
    finally:
        proxy.close()


def test_upload_run_goes_through_the_same_retrying_client(s3, tmp_path, monkeypatch, caplog):
    from exonet.runtime.storage import upload_run

    run = tmp_path / "20261201-ddp"
    (run / "sim").mkdir(parents=True)
    for name in ("status.json", "config.json", "metrics.jsonl", "sim/trace.json"):
        (run / name).write_text(name)
    proxy = DropFirst(s3.endpoint, drops=1)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        keys = upload_run(run, "s3://exo/sweeps/a/", retries=2)
    finally:
        proxy.close()
    assert proxy.dropped == 1 and "retry 1 of 2" in caplog.text
    prefix = "sweeps/a/20261201-ddp/"
    assert keys[-1] == prefix + "status.json" and sorted(keys) == sorted(
        prefix + n for n in ("config.json", "metrics.jsonl", "sim/trace.json", "status.json"))
    for key in keys:
        assert s3.client.get_object(Bucket="exo", Key=key)["Body"].read().decode() == key.removeprefix(prefix)
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        upload_run(run, "bucket/prefix")


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_a_local_folder_reads_the_same(tmp_path, scheme):
    write_shards(DATA, tmp_path / "digits", shard_size=10)
    ds = S3Dataset(f"{scheme}{tmp_path / 'digits'}")
    assert len(ds) == 96 and all(_same(ds[i], DATA[i]) for i in range(96)) and len(ds.fetched) == 10


def test_a_missing_local_folder_or_an_endpoint_for_one_is_an_error(tmp_path):
    write_shards(DATA, tmp_path / "digits", shard_size=10)
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path / 'none' / 'index.json'}: no such folder"):
        S3Dataset(tmp_path / "none")
    with pytest.raises(TypeError, match=r"endpoint_url: only for s3:// URLs"):
        S3Dataset(tmp_path / "digits", endpoint_url="http://x")


def test_write_shards_names_a_sample_that_does_not_fit(tmp_path):
    rows = [(torch.zeros(3), 1), (torch.zeros(4), 2)]
    with pytest.raises(ValueError, match=r"sample 1 field '0' is torch.float32 \(4,\), sample 0's is float32 \(3,\)"):
        write_shards(rows, tmp_path, shard_size=8)


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_memory_stays_bounded_reading_more_than_the_cache(s3):
    big = [(torch.full((16384,), float(i)),) for i in range(256)]  # 64 shards of 4 samples x 64 KiB = 16 MiB
    write_shards(big, "s3://exo/big", shard_size=4)
    ds = S3Dataset("s3://exo/big", cache_bytes="1 MiB")
    ds[0]
    before, peak, on_disk = _rss_kib(), 0, 0
    for i in range(len(ds)):
        assert ds[i][0][0].item() == i
        peak = max(peak, _rss_kib())
        on_disk = max(on_disk, sum(p.stat().st_size for p in ds._cache_folder().iterdir()))
    assert len(ds.fetched) == 64 and len(ds._open) <= 4
    assert on_disk <= 1 << 20
    assert peak - before < 8 * 1024, f"RSS grew {peak - before} KiB reading 16 MiB through a 1 MiB cache"


# ------------------------------------------------------------------ an index names files inside its folder only
SHARD_BYTES = 32 * 8 * 4 + 32 * 8  # a shard of 32 DATA samples: 32 rows of 8 float32, then 32 int64


@pytest.mark.parametrize("entry", ["absolute", "../victim"])
def test_an_s3_index_naming_a_file_outside_its_folder_is_refused_and_nothing_is_touched(s3, tmp_path, entry):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    name = str(victim) if entry == "absolute" else entry  # "../victim": one level above the cache folder
    cache = tmp_path / "cache"
    prefix = f"evil-{len(entry)}"
    index = write_shards(DATA, f"s3://exo/{prefix}", shard_size=32)
    index["shards"][0]["file"] = name
    for key, body in (("index.json", json.dumps(index).encode()), (name, b"\0" * SHARD_BYTES)):
        s3.client.put_object(Bucket="exo", Key=f"{prefix}/{key}", Body=body)  # the attacker's bucket
    with pytest.raises(ValueError, match=rf"^s3://exo/{prefix}/index.json: shards\[0\].file: "
                                         rf"{re.escape(repr(name))} is not a plain name inside its folder"):
        ds = S3Dataset(f"s3://exo/{prefix}", cache_dir=str(cache / "sub"), cache_bytes=1)
        for i in range(len(ds)):  # the old reader wrote shard 0 over the victim, then evicted (deleted) it
            ds[i]
    assert victim.read_bytes() == b"precious"
    assert not [p for p in cache.rglob("*") if p.is_file()]  # "../victim" would have landed in cache/sub


@pytest.mark.parametrize("entry", ["absolute", "../victim", "", "a/b", "a\\b", "..", "x\0y"])
def test_a_folder_index_naming_a_file_outside_its_folder_is_refused(tmp_path, entry):
    victim = tmp_path / "victim"
    victim.write_bytes(b"\1" * SHARD_BYTES)  # a shard's size: the old reader read it as shard 0
    name = str(victim) if entry == "absolute" else entry
    folder = tmp_path / "data"
    index = write_shards(DATA, folder, shard_size=32)
    index["shards"][0]["file"] = name
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(folder / 'index.json'))}: shards\[0\].file: "
                                         rf"{re.escape(repr(name))} is not a plain name inside its folder"):
        S3Dataset(folder)[0]


def test_eviction_deletes_only_what_it_downloaded_even_if_the_index_changes_after_its_check(s3, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    ds = S3Dataset("s3://exo/digits", cache_dir=str(tmp_path / "cache"), cache_bytes=1)
    ds[0]
    ds.index["shards"][1]["file"] = str(victim)  # past the index's check: the store refuses the name itself
    with pytest.raises(ValueError, match=r"^s3://exo/digits: object name: .* is not a plain name inside its folder"):
        ds[8]
    assert victim.read_bytes() == b"precious" and ds.fetched == [0]
    assert list(ds._cache_folder().iterdir()) == []  # shard 0 was evicted, and only it


def test_a_shard_larger_than_its_index_declares_is_refused_before_it_is_downloaded(s3, tmp_path):
    """An object swapped for a larger one after the index was written: its length is checked against the index's
    ``bytes`` from the response's headers, and not one chunk of it reaches the cache (it was fetched whole)."""
    write_shards(DATA, "s3://exo/swapped", shard_size=8)
    s3.client.put_object(Bucket="exo", Key="swapped/" + json.loads(s3.client.get_object(
        Bucket="exo", Key="swapped/index.json")["Body"].read())["shards"][1]["file"], Body=b"\0" * (4 << 20))
    ds = S3Dataset("s3://exo/swapped", cache_dir=str(tmp_path / "cache"))
    assert _same(ds[0], DATA[0])
    with pytest.raises(ValueError, match=r"^s3://exo/swapped/.*: 4,194,304 bytes, but the index declares 320: "
                                         r"not downloaded"):
        ds[8]
    assert [p.name for p in ds._cache_folder().iterdir()] == [ds.index["shards"][0]["file"]]
