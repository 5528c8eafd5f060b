"""The same script runs under torchrun: real processes launched by torch's own launcher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exonet import LocalTrainer
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.toy import linear_regressor, synthetic_regression


@pytest.mark.slow
def test_fit_under_torchrun_matches_the_local_run(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(Path(__file__).with_name("torchrun_fit.py")), str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    local = LocalTrainer(linear_regressor(), synthetic_regression(n=96)).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.05)), num_nodes=2, max_steps=6, batch_size=4, shuffle=False,
        progress=False, device="cpu")
    for mine, theirs in zip(local.model.parameters(), got["params"]):
        assert torch.allclose(mine.detach().flatten(), torch.tensor(theirs), atol=1e-6)
    assert got["loss"] == pytest.approx(local.history["train_loss"], abs=1e-6)
    assert got["payload"] == [local.payload_bytes(0), local.payload_bytes(1)]
    assert got["steps"] == [6, 6]
