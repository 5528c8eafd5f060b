"""Job: what one fit runs, resolved and validated in the parent before any node starts.

``LocalTrainer.fit`` builds it and hands it to the launcher (exonet.runtime.run) or to the
torchrun path (exonet.runtime.torchrun), so neither needs to know the trainer: the
runtime's modules import downwards only, trainer -> run -> node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from exonet.runtime.node import NodeConfig
from exonet.strategies.base import Strategy


@dataclass(frozen=True)
class Job:
    """The model, the datasets, the strategy and the frozen node configuration of one fit.

    Attributes:
        model: the initial model (every node starts from a copy of it).
        train_dataset / val_dataset: a Dataset or a factory ``f(rank, num_nodes, train)``; val may be None.
        strategy: the strategy every node runs (each gets its own copy).
        cfg: the node configuration shipped to every node.
    """

    model: torch.nn.Module
    train_dataset: Any
    val_dataset: Any
    strategy: Strategy
    cfg: NodeConfig
