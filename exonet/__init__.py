"""exonet: low-communication distributed training on one machine, with a simulated network.

Names are loaded lazily so that ``import exonet`` (and the CLI) stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from exonet.errors import NodeFailure, ScenarioError, TraceError
from exonet.trace import Trace

__version__ = "0.1.0"

_LAZY = {
    "LocalTrainer": "exonet.runtime.trainer",
    "Trainer": "exonet.runtime.trainer",
    "get_device": "exonet.runtime.trainer",
    "FitResult": "exonet.runtime.fit_result",
    "Scenario": "exonet.scenario",
    "simulate": "exonet.netsim",
    "SimResult": "exonet.netsim",
    "compare": "exonet.study.comparison",
    "warm_up": "exonet.runtime.forkserver",
    "PipelineSpec": "exonet.estimate.pipeline",
    "Staged": "exonet.runtime.pipeline",
}

__all__ = ["NodeFailure", "ScenarioError", "Trace", "TraceError", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'exonet' has no attribute {name!r}")
    if name in ("LocalTrainer", "Trainer"):  # a fit is coming: the server that forks its nodes starts its imports
        from exonet.runtime.forkserver import warm_up_by_default  # now, beside this process's import of torch

        warm_up_by_default()
    return getattr(importlib.import_module(module), name)
