"""How a strategy's nodes swap messages: one all-gather, or an object store between peers.

Decentralised runs of SparseLoCo (Templar) exchange through a bucket rather than a collective: each peer
uploads its message once and downloads the others'. ``exchange`` gives a strategy either, with the same
result (every member's message, one row per member), so the choice is one argument, ``transport``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from exonet.communicator import Communicator

TRANSPORTS = ("all_gather", "store")


def check_transport(transport: object, allowed: tuple[str, ...] = TRANSPORTS) -> str:
    if transport not in allowed:
        raise ValueError(f"transport must be one of {', '.join(map(repr, allowed))}, got {transport!r}")
    assert isinstance(transport, str)  # one of the allowed names
    return transport


def exchange(comm: Communicator, message: torch.Tensor, members: tuple[int, ...], transport: str,
             key: str) -> torch.Tensor:
    """Every member's ``message`` (same shape on all), stacked in member order.

    ``"all_gather"``: one all-gather on the group. ``"store"``: this node puts its message under
    ``{key}/rank{r}`` and gets every other member's (asynchronously, then waits on them all); ``key`` must be
    new for each exchange (a round number in it).
    """
    if transport == "all_gather":
        return comm.all_gather(message, group=members if len(members) < comm.world_size else None)
    comm.put(f"{key}/rank{comm.rank}", message)
    rows = {r: message if r == comm.rank else torch.empty_like(message) for r in members}
    reads = [comm.get(f"{key}/rank{r}", rows[r], async_op=True) for r in members if r != comm.rank]
    for read in reads:
        read.wait()
    return torch.stack([rows[r] for r in members])
