"""Reference tables in the READMEs are the code's own output (issue 32, references that cannot drift)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from exonet.runtime.reference import documented_args, fit_arguments
from exonet.runtime.trainer import LocalTrainer

ROOT = Path(__file__).resolve().parents[1]


def test_the_runtime_readme_holds_fits_arguments_as_the_code_renders_them():
    assert fit_arguments() in (ROOT / "exonet" / "runtime" / "README.md").read_text()


def test_every_fit_argument_is_documented_with_its_default():
    table = fit_arguments()
    for name, p in inspect.signature(LocalTrainer.fit).parameters.items():
        if name != "self" and p.kind != p.VAR_KEYWORD:
            assert f"| `{name}` | " in table
    assert "| `batch_size` | `16` |" in table and "| `val_interval` | `100` |" in table


def test_an_undocumented_argument_is_named():
    def fit(self, a: int = 1, b: int = 2) -> None:
        """Run.

        Args:
            a: the first,
                on two lines.
        """

    assert documented_args(fit) == {"a": "the first, on two lines."}
    with pytest.raises(ValueError, match="argument 'shuffle' is not in its docstring's Args"):
        original = LocalTrainer.fit.__doc__
        try:
            LocalTrainer.fit.__doc__ = original.replace("            shuffle:", "            shufle:")
            fit_arguments()
        finally:
            LocalTrainer.fit.__doc__ = original
