"""Random streams every node derives identically from the run seed, at zero bytes on the wire."""

from __future__ import annotations

import hashlib

import torch


def shared_generator(seed: int, *keys: int | str) -> torch.Generator:
    """A CPU generator that every node derives identically from the run seed and ``keys``.

    Masks, participants and island partitions drawn from it agree on all nodes at zero
    bytes on the wire (the seed gym broadcasts them instead). Hashing, rather than
    adding, the keys keeps streams for different purposes and rounds independent.
    """
    digest = hashlib.blake2b(repr((seed, *keys)).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
