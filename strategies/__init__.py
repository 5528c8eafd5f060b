"""Strategies: how K nodes turn local gradients into a shared model, through a Communicator."""

from exonet.strategies.base import NodeContext, OptimSpec, Strategy
from exonet.strategies.ddp import AllReduceStrategy, DDPStrategy

__all__ = ["AllReduceStrategy", "DDPStrategy", "NodeContext", "OptimSpec", "Strategy"]
