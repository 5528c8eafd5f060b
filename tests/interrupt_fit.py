"""A long fit for tests to stop (run as ``python tests/interrupt_fit.py RUN_ROOT``).

Not a test module: the ``running_fit`` fixture (tests/conftest.py) starts it in a subprocess and
waits for its first committed checkpoint (training is then under way); tests send it SIGINT,
SIGTERM or SIGHUP, or try to resume its run directory while it runs.
"""

import sys

from exonet import LocalTrainer
from exonet.strategies import DDPStrategy
from exonet.toy import synthetic_classification, tiny_mlp

if __name__ == "__main__":
    LocalTrainer(tiny_mlp(), synthetic_classification(256, dim=8, classes=4)).fit(
        DDPStrategy(), num_nodes=2, max_steps=10_000_000, batch_size=8, run_dir=sys.argv[1], checkpoint_interval=20,
        progress=False)
