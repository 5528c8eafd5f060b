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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exonet.data.store import open_store
from exonet.files import plain_name
from exonet.units import plural

FORMAT, VERSION, ALIGN = "exonet-shards", 1, 64
INDEX = "index.json"
STRUCTURES = ("tensor", "tuple", "dict")
# The dtypes a shard holds: whole bytes per element that torch can view raw (not sub-byte or quantized types).
DTYPES = {name: dtype for name in (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "bfloat16",
    "float32", "float64", "complex32", "complex64", "complex128", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu") if isinstance(dtype := getattr(torch, name, None), torch.dtype)}


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
    for field in fields:
        if field["dtype"] not in DTYPES:
            raise TypeError(f"write_shards: field {field['name']!r} is {field['dtype']}, which a shard cannot hold "
                            f"({', '.join(DTYPES)})")
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
    """Check an index.json as data before anything is read or written by it.

    Every field is typed and consistent with the layout the reader computes offsets from (shard
    ``i`` holds rows ``[i·shard_size, ...)``; each field's rows fit in the shard's bytes), and each
    shard's ``file`` is a plain file name inside the index's folder: an index from someone else's
    bucket can neither write nor delete a file elsewhere. Errors are ValueErrors naming ``where``
    (the index) and the entry.
    """
    try:
        index = json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an integer too long, nesting too deep
        raise ValueError(f"{where}: not a shard index ({type(exc).__name__}: {exc})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise ValueError(f"{where}: not an {FORMAT} index "
                         f"(format is {index.get('format') if isinstance(index, dict) else index!r:.80})")
    version = index.get("version")
    if isinstance(version, bool) or version != VERSION:
        raise ValueError(f"{where}: version {version!r:.80} is not supported (this exonet reads {VERSION})")
    _keys(index, ("format", "version", "num_samples", "shard_size", "structure", "fields", "shards"), where)
    n = _int(index["num_samples"], f"{where}: num_samples", 1)
    size = _int(index["shard_size"], f"{where}: shard_size", 1)
    if index["structure"] not in STRUCTURES:
        raise ValueError(f"{where}: structure must be one of {', '.join(STRUCTURES)}, got {index['structure']!r:.80}")
    fields = _list(index["fields"], f"{where}: fields")
    if not fields or (index["structure"] == "tensor" and len(fields) != 1):
        raise ValueError(f"{where}: fields: a {index['structure']} sample has "
                         f"{'one field' if index['structure'] == 'tensor' else 'at least one field'}, "
                         f"the index lists {len(fields)}")
    row_bytes = [_field(field, f"{where}: fields[{f}]") for f, field in enumerate(fields)]
    names = [field["name"] for field in fields]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: fields: two fields are named {next(x for x in names if names.count(x) > 1)!r}")
    shards = _list(index["shards"], f"{where}: shards")
    count = -(-n // size)
    if len(shards) != count:
        raise ValueError(f"{where}: shards: {plural(n, 'sample')} in shards of {size} make {count} shards, "
                         f"the index lists {len(shards)}")
    files: set[str] = set()
    for s, shard in enumerate(shards):
        _shard(shard, f"{where}: shards[{s}]", min(size, n - s * size), row_bytes)
        if shard["file"] in files:
            raise ValueError(f"{where}: shards[{s}].file: {shard['file']!r} is another shard's file too")
        files.add(shard["file"])
    return index


def _keys(entry: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    """``entry`` holds exactly ``keys``: a missing one or one this exonet does not know is named."""
    missing = [k for k in keys if k not in entry]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r:.80} (an index holds {', '.join(keys)})")


def _int(value: Any, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where}: expected an integer >= {low}, got {value!r:.80}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _field(field: Any, where: str) -> int:
    """Check one field; returns the bytes one row of it takes."""
    if not isinstance(field, dict):
        raise ValueError(f"{where}: expected an object, got {type(field).__name__}")
    _keys(field, ("name", "dtype", "shape"), where)
    if not isinstance(field["name"], str):
        raise ValueError(f"{where}.name: expected a string, got {field['name']!r:.80}")
    dtype = DTYPES.get(field["dtype"]) if isinstance(field["dtype"], str) else None
    if dtype is None:
        raise ValueError(f"{where}.dtype: {field['dtype']!r:.80} is not a dtype a shard holds "
                         f"({', '.join(DTYPES)})")
    shape = [_int(d, f"{where}.shape", 0) for d in _list(field["shape"], f"{where}.shape")]
    return math.prod(shape) * dtype.itemsize


def _shard(shard: Any, where: str, rows: int, row_bytes: list[int]) -> None:
    """Check one shard entry: its file a plain name, ``rows`` rows, each field's rows inside its bytes."""
    if not isinstance(shard, dict):
        raise ValueError(f"{where}: expected an object, got {type(shard).__name__}")
    _keys(shard, ("file", "rows", "bytes", "offsets"), where)
    plain_name(shard["file"], f"{where}.file")
    if _int(shard["rows"], f"{where}.rows", 0) != rows:
        raise ValueError(f"{where}.rows: this shard holds {rows} rows (num_samples and shard_size say so), "
                         f"the index says {shard['rows']}")
    size = _int(shard["bytes"], f"{where}.bytes", 0)
    offsets = _list(shard["offsets"], f"{where}.offsets")
    if len(offsets) != len(row_bytes):
        raise ValueError(f"{where}.offsets: {len(offsets)} offsets for {plural(len(row_bytes), 'field')}")
    for f, (offset, width) in enumerate(zip(offsets, row_bytes)):
        _int(offset, f"{where}.offsets[{f}]", 0)
        if offset % ALIGN or offset + rows * width > size:
            raise ValueError(f"{where}.offsets[{f}]: field {f} at byte {offset} ({rows} rows of {width} bytes) "
                             f"must start at a multiple of {ALIGN} and end within the shard's {size} bytes")


class OpenShard:
    """One shard file memory-mapped (copy-on-write: torch may view it without a read-only warning)."""

    def __init__(self, path: str | os.PathLike, entry: dict[str, Any], fields: list[dict[str, Any]]) -> None:
        size = os.path.getsize(path)
        if size != entry["bytes"]:
            raise OSError(f"{path}: {size} bytes, the index says {entry['bytes']} (a truncated or foreign file)")
        self.path = Path(path)
        self.map = np.memmap(path, dtype=np.uint8, mode="c") if size else bytearray()  # an empty file has no map
        self.columns = []
        for field, offset in zip(fields, entry["offsets"]):
            dtype = DTYPES[field["dtype"]]
            count = entry["rows"] * math.prod(field["shape"])  # torch views no buffer as 0 elements: make them
            flat = torch.frombuffer(self.map, dtype=dtype, count=count, offset=offset) if count else \
                torch.empty(0, dtype=dtype)
            self.columns.append(flat.view(entry["rows"], *field["shape"]))
        self.nbytes = size

    def row(self, r: int) -> list[torch.Tensor]:
        return [c[r].clone() for c in self.columns]
