"""The server that forks a fit's nodes starts when a fit is coming (``exonet.LocalTrainer`` asked for), only then."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import exonet
{touch}
from multiprocessing import forkserver
print(forkserver._forkserver._forkserver_pid is not None)
"""


def server_running(touch: str, **env: str) -> bool:
    """Whether a fresh process that imports exonet and runs ``touch`` has started the server."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(touch=touch)], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize("touch", ["from exonet import LocalTrainer", "exonet.Trainer"])
def test_asking_for_the_trainer_starts_the_server_beside_the_import_of_torch(touch: str) -> None:
    assert server_running(touch)


@pytest.mark.parametrize("touch, env", [
    ("exonet.simulate, exonet.Scenario", {}),  # simulating, estimating, the CLI: no fit, no server
    ("from exonet import LocalTrainer", {"EXONET_WARM_UP": "0"}),
    ("from exonet import LocalTrainer", {"TORCHELASTIC_RUN_ID": "x"}),  # torchrun starts the nodes itself
])
def test_no_server_where_no_fit_forks_nodes_or_it_is_turned_off(touch: str, env: dict[str, str]) -> None:
    assert not server_running(touch, **env)
