"""``python -m exonet.bench simulator``: the network simulator's benchmark under its suite name
(exonet.bench.netsim)."""

from exonet.bench.netsim import main

__all__ = ["main"]
