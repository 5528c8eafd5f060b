"""Strategies: how K nodes turn local gradients into a shared model, through a Communicator.

``STRATEGIES`` maps the short names used on the command line (``diloco:H=500``) to classes.
"""

from exonet.strategies.async_diloco import AsyncDiLoCoStrategy
from exonet.strategies.base import NodeContext, OptimSpec, Strategy
from exonet.strategies.ddp import AllReduceStrategy, DDPStrategy, SimpleReduceStrategy
from exonet.strategies.decoupled_diloco import DecoupledDiLoCoStrategy
from exonet.strategies.demo import DeMoStrategy
from exonet.strategies.diloco import DiLoCoStrategy
from exonet.strategies.fedavg import FedAvgStrategy
from exonet.strategies.fedbuff import FedBuffStrategy
from exonet.strategies.muloco import MuLoCoStrategy
from exonet.strategies.noloco import NoLoCoStrategy
from exonet.strategies.sparseloco import SparseLoCoStrategy
from exonet.strategies.sparta import SPARTAStrategy
from exonet.strategies.sparta_diloco import SPARTADiLoCoStrategy
from exonet.strategies.streaming_diloco import StreamingDiLoCoStrategy

STRATEGIES: dict[str, type[Strategy]] = {
    "ddp": DDPStrategy,
    "allreduce": DDPStrategy,
    "fedavg": FedAvgStrategy,
    "diloco": DiLoCoStrategy,
    "sparta": SPARTAStrategy,
    "demo": DeMoStrategy,
    "sparta_diloco": SPARTADiLoCoStrategy,
    "streaming_diloco": StreamingDiLoCoStrategy,
    "async_diloco": AsyncDiLoCoStrategy,
    "fedbuff": FedBuffStrategy,
    "decoupled_diloco": DecoupledDiLoCoStrategy,
    "sparseloco": SparseLoCoStrategy,
    "noloco": NoLoCoStrategy,
    "muloco": MuLoCoStrategy,
}

__all__ = [
    "AllReduceStrategy", "AsyncDiLoCoStrategy", "DDPStrategy", "DeMoStrategy", "DecoupledDiLoCoStrategy",
    "DiLoCoStrategy", "FedAvgStrategy", "FedBuffStrategy", "MuLoCoStrategy", "NoLoCoStrategy", "NodeContext",
    "OptimSpec", "SPARTADiLoCoStrategy", "SPARTAStrategy", "STRATEGIES", "SimpleReduceStrategy", "SparseLoCoStrategy",
    "StreamingDiLoCoStrategy", "Strategy",
]
