"""The shard format: fixed-size rows of raw tensor bytes, one file per shard, one JSON index.

Layout under a URL (``s3://bucket/prefix`` or a folder)::

    index.json          {"format": "exonet-shards", "version": 1, "num_samples", "shard_size",
                         "structure": "tensor" | "tuple" | "dict",
                         "fields": [{"name", "dtype", "shape"}, ...],
                         "shards": [{"file", "rows", "bytes", "offsets": [one per field]}, ...]}
    shard-00000.bin     field 0 of every row (C order), then field 1, ... each at a 64-byte-aligned offset

Why this format: every sample of a field has the same shape and dtype, so sample ``i`` is
row ``i % shard_size`` of shard ``i // shard_size`` and its bytes sit at a computed
offset. A node can therefore fetch exactly the shards it reads (one GET each, streamed
to disk), and read rows straight out of a memory map: no parsing, no decompression, no
pickle (so reading someone else's bucket runs no code), and memory stays what the cache
holds. Raw bytes keep every torch dtype, bfloat16 included. The index is written last, so
a reader that finds it knows every shard is there.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import torch

from exonet.data.store import open_store

FORMAT, VERSION, ALIGN = "exonet-shards", 1, 64
INDEX = "index.json"


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.bin"


def _fields(sample: Any, where: str) -> tuple[str, list[str], list[torch.Tensor]]:
    """(structure, field names, tensors) of one sample: a tensor, a tuple/list or a dict of tensor-likes."""
    def tensor(value: Any, name: str) -> torch.Tensor:
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"write_shards: {where} field {name!r}: cannot store a {type(value).__name__} "
                            f"({exc}); samples must be tensors, numbers or arrays") from None

    if isinstance(sample, dict):
        names = [str(k) for k in sample]
        return "dict", names, [tensor(v, k) for k, v in zip(names, sample.values())]
    if isinstance(sample, (tuple, list)):
        return "tuple", [str(i) for i in range(len(sample))], [tensor(v, str(i)) for i, v in enumerate(sample)]
    return "tensor", ["0"], [tensor(sample, "0")]


def write_shards(dataset: Any, url: str | os.PathLike, shard_size: int = 4096, **store_options: Any) -> dict[str, Any]:
    """Write ``dataset`` (``len`` and ``[i]``) as shards of ``shard_size`` samples plus an index.

    Args:
        dataset: every sample a tensor, a tuple/list or a dict of tensors, with the same shapes and dtypes.
        url: ``s3://bucket/prefix``, ``file:///path`` or a folder path.
        shard_size: samples per shard (the last shard may hold fewer).
        **store_options: for S3: ``endpoint_url``, ``region``, credentials, ``retries`` (see exonet.data.store).

    Returns:
        The index that was written.
    """
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"write_shards: shard_size must be an integer >= 1, got {shard_size!r}")
    n = len(dataset)
    if n < 1:
        raise ValueError("write_shards: the dataset is empty")
    store = open_store(url, **store_options)
    structure, names, first = _fields(dataset[0], "sample 0")
    fields = [{"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
              for name, t in zip(names, first)]
    shards = []
    for s, start in enumerate(range(0, n, shard_size)):
        rows = [first if i == 0 else _fields(dataset[i], f"sample {i}")[2]
                for i in range(start, min(n, start + shard_size))]
        for i, row in enumerate(rows, start=start):
            for field, t in zip(fields, row):
                if str(t.dtype).removeprefix("torch.") != field["dtype"] or list(t.shape) != field["shape"]:
                    raise ValueError(f"write_shards: sample {i} field {field['name']!r} is {t.dtype} "
                                     f"{tuple(t.shape)}, sample 0's is {field['dtype']} {tuple(field['shape'])}; "
                                     "every sample must have the same shapes and dtypes")
            if len(row) != len(fields):
                raise ValueError(f"write_shards: sample {i} has {len(row)} fields, sample 0 has {len(fields)}")
        blob, offsets = bytearray(), []
        for f in range(len(fields)):
            blob += bytes(-len(blob) % ALIGN)
            offsets.append(len(blob))
            column = torch.stack([row[f] for row in rows]).contiguous()
            blob += column.reshape(-1).view(torch.uint8).numpy().tobytes()
        store.write(shard_name(s), bytes(blob))
        shards.append({"file": shard_name(s), "rows": len(rows), "bytes": len(blob), "offsets": offsets})
    index = {"format": FORMAT, "version": VERSION, "num_samples": n, "shard_size": shard_size,
             "structure": structure, "fields": fields, "shards": shards}
    store.write(INDEX, (json.dumps(index, indent=1) + "\n").encode())
    return index


def parse_index(data: bytes, where: str) -> dict[str, Any]:
    """Check an index.json; errors name the file and the field."""
    try:
        index = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: not a shard index ({exc})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise ValueError(f"{where}: not an {FORMAT} index "
                         f"(format is {index.get('format') if isinstance(index, dict) else index!r})")
    if index.get("version") != VERSION:
        raise ValueError(f"{where}: version {index.get('version')!r} is not supported (this exonet reads {VERSION})")
    for field in index["fields"]:
        if not isinstance(getattr(torch, field["dtype"], None), torch.dtype):
            raise ValueError(f"{where}: field {field['name']!r} has unknown dtype {field['dtype']!r}")
    if sum(s["rows"] for s in index["shards"]) != index["num_samples"]:
        raise ValueError(f"{where}: the shards hold {sum(s['rows'] for s in index['shards'])} rows, "
                         f"num_samples says {index['num_samples']}")
    return index


class OpenShard:
    """One shard file memory-mapped (copy-on-write: torch may view it without a read-only warning)."""

    def __init__(self, path: str | os.PathLike, entry: dict[str, Any], fields: list[dict[str, Any]]) -> None:
        size = os.path.getsize(path)
        if size != entry["bytes"]:
            raise OSError(f"{path}: {size} bytes, the index says {entry['bytes']} (a truncated or foreign file)")
        self.map = np.memmap(path, dtype=np.uint8, mode="c")
        self.columns = []
        for field, offset in zip(fields, entry["offsets"]):
            dtype = getattr(torch, field["dtype"])
            numel = math.prod(field["shape"])
            flat = torch.frombuffer(self.map, dtype=dtype, count=entry["rows"] * numel, offset=offset)
            self.columns.append(flat.view(entry["rows"], *field["shape"]))
        self.nbytes = size

    def row(self, r: int) -> list[torch.Tensor]:
        return [c[r].clone() for c in self.columns]
