"""The extension API is typed through: mypy checks strategies/ and the runtime reads what Strategy declares.

strategies/ is installed as ``exonet.strategies`` by a package-dir mapping that mypy cannot read; pyproject's
``[tool.mypy]`` finds it through ``.ci/mypy`` instead. Were that lost, mypy would read every strategy as
``Any`` and pass whatever strategies/ held: the test below plants an error there and runs mypy as CI does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exonet import LocalTrainer
from exonet.strategies import Strategy
from exonet.toy import synthetic_classification, tiny_mlp

ROOT = Path(__file__).resolve().parents[1]
# what `python -m mypy` reads: its configuration, the package, the mapped strategies and mypy's link to them
CHECKED = ("pyproject.toml", "exonet", "strategies", ".ci")
PLANTED = 'def _planted() -> int:\n    return "not an int"\n'


@pytest.mark.slow  # a cold mypy run over the whole package: about 30 s
def test_mypy_as_ci_runs_it_finds_an_error_planted_in_strategies_base(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in CHECKED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", ".mypy_cache"))
        else:
            shutil.copy2(source, copy / name)
    env = {**os.environ, "MYPY_CACHE_DIR": str(tmp_path / "cache")}

    def mypy() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mypy"], cwd=copy, env=env, capture_output=True, text=True,
                              timeout=600)

    clean = mypy()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    base = copy / "strategies" / "base.py"
    text = base.read_text()
    line = text.count("\n") + 3  # the return line of the planted function, after one blank line
    base.write_text(text + "\n" + PLANTED)
    planted = mypy()
    assert planted.returncode == 1, planted.stdout + planted.stderr
    assert f"strategies/base.py:{line}: error: Incompatible return value type" in planted.stdout, planted.stdout


class _NoServe(Strategy):
    """Declares a server rank but does not say what it does."""

    servers = 1

    def step(self) -> None:
        self.optimizer_step()


def test_a_strategy_with_servers_but_no_serve_is_refused_before_any_node_starts() -> None:
    trainer = LocalTrainer(tiny_mlp(), synthetic_classification(16, dim=8, classes=4))
    with pytest.raises(TypeError, match=r"_NoServe declares servers = 1 but has no serve\(\); subclass "
                                        r"exonet.strategies.server.ServerStrategy"):
        trainer.fit(_NoServe(), num_nodes=2, max_steps=1, batch_size=4, progress=False)


def test_strategy_declares_what_the_runtime_reads() -> None:
    """``fit`` and ``estimate`` read these of any Strategy, with no getattr: the base class has each."""
    assert (Strategy.name, Strategy.servers, Strategy.elastic) == ("strategy", 0, False)
    lonely = _NoServe()
    assert lonely.asynchronous  # a server decides who syncs when
    with pytest.raises(NotImplementedError, match="declares servers = 1 but has no serve"):
        lonely.serve(lambda updates, sim_time_s: None)
