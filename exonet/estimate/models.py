"""The model an estimate runs on the meta device: exonet's layer stack of a stated size, or the user's own.

Shapes, never memory: strategies whose payload depends on shapes (DeMo's 64 × 64 DCT blocks, SparseLoCo's
tiles) see the shapes a real model of that size has.
"""

from __future__ import annotations

import importlib
import math
from typing import Callable

import torch

DEFAULT_LAYERS = 24
# What the model holds. The layer stack's largest tensor, at most a third of it, stays within the 2**63
# bytes torch can size (6.9e18 parameters of 4 bytes at one block).
MAX_PARAMS = 1e18
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


class LayerStack(torch.nn.Module):
    """``params`` parameters as a token embedding and ``layers`` transformer-like blocks, on the meta device.

    Sized as real models are, so that strategies whose payload depends on shapes (DeMo's
    64 × 64 DCT blocks) see real shapes: the width d is the largest multiple of 128 (of 8
    below 128) with 12·d²·layers ≤ ``params``; each block holds four matrices, d×3d (QKV),
    d×d (output), d×4d and 4d×d (MLP); the remainder goes to an embedding of V×d, V a
    multiple of 128 (vocabularies are padded so), which keeps the total within 64·d of
    ``params``.
    """

    def __init__(self, params: int, layers: int, dtype: torch.dtype) -> None:
        super().__init__()
        raw = math.sqrt(params / (12 * layers))
        granule = 128 if raw >= 128 else 8 if raw >= 8 else 1
        d = max(1, int(raw // granule) * granule)
        vocab = max(0, round((params - 12 * layers * d * d) / (128 * d))) * 128
        self.width, self.vocab = d, vocab

        def param(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(*shape, device="meta", dtype=dtype))

        self.embedding = torch.nn.ParameterList([param(vocab, d)] if vocab else [])
        shapes = ((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d))
        self.blocks = torch.nn.ModuleList(torch.nn.ParameterList(param(*shape) for shape in shapes)
                                          for _ in range(layers))


def load_model(spec: str, dtype: torch.dtype) -> torch.nn.Module:
    """``"package.module:factory"`` → the module the factory returns, built on the meta device in ``dtype``."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"model={spec!r}: expected module:factory (e.g. mypkg.models:build)")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        hint = ("; it is looked for on the import path, which holds the current folder under python -m exonet (or "
                "PYTHONPATH=. exonet ...) but not under the bare exonet command"
                if isinstance(exc, ModuleNotFoundError) and exc.name == module_name.split(".")[0] else "")
        raise ValueError(f"model={spec!r}: cannot import {module_name!r}: {exc}{hint}") from None
    except AttributeError:
        raise ValueError(f"model={spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(factory):
        raise TypeError(f"model={spec!r}: not callable")
    with torch.device("meta"):
        model = factory()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model={spec!r}: {spec}() returned {type(model).__name__}, expected a torch.nn.Module")
    return model.to(dtype=dtype)


def given_model(model: str | Callable[[], torch.nn.Module],
                 dtype: torch.dtype) -> tuple[Callable[[], torch.nn.Module], str]:
    """``estimate(model=...)``: a factory of the model on the meta device in ``dtype``, and its description."""
    if isinstance(model, str):
        spec = model
        return (lambda: load_model(spec, dtype)), f"{spec}()"
    factory = model

    def make_model() -> torch.nn.Module:
        with torch.device("meta"):
            return factory().to(dtype=dtype)

    return make_model, f"{getattr(factory, '__name__', repr(factory))}()"


def check_stack(params: float | None, layers: int | None, dtype: str) -> None:
    """``estimate``'s model size, blocks and dtype, checked before anything is built."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise ValueError(f"layers= must be an integer >= 1, got {layers!r}")
    if params is not None and math.isfinite(params) and params > MAX_PARAMS:
        raise ValueError(f"params={params:g}: more than the layer stack holds ({MAX_PARAMS:g} parameters: "
                         "torch sizes a tensor up to 2**63 bytes)")
    if params is not None and layers is not None and layers > params / 12:
        raise ValueError(f"layers={layers}: more blocks than {params:g} parameters fill (a block holds at least "
                         "12 parameters, 12·d² with d >= 1)")
