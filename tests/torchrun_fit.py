"""Run by tests/test_runtime_torchrun.py under torchrun: the same fit a local run does, twice,
results to a JSON file."""

import json
import os
import sys

from exonet import LocalTrainer
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.toy import linear_regressor, synthetic_regression

if __name__ == "__main__":
    runs = [LocalTrainer(linear_regressor(), synthetic_regression(n=96)).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.05)), num_nodes=2, max_steps=6, batch_size=4, shuffle=False,
        progress=False, device="cpu") for _ in range(2)]  # a second fit in the same workers rendezvous again
    result = runs[1]
    assert runs[0].history["train_loss"] == result.history["train_loss"]
    if os.environ["RANK"] == "0":
        with open(sys.argv[1], "w") as f:
            json.dump({"params": [p.detach().flatten().tolist() for p in result.model.parameters()],
                       "loss": result.history["train_loss"], "payload": [result.payload_bytes(r) for r in range(2)],
                       "steps": [result.trace.num_steps(r) for r in range(2)]}, f)
