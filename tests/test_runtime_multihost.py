"""Two hosts for real: two network namespaces joined by a bridge, torchrun on each, c10d rendezvous.

Each namespace runs ``torchrun --nnodes 2 --nproc-per-node 2`` on examples/torchrun_study.py,
the README's two-host command, with the rendezvous on the first namespace's address.
DDP and DiLoCo must give the local run's loss curve and payload bytes (same seed, K=4).
Namespaces come from exonet.validate.netns; the test needs root (it tries to make a
scratch namespace) and skips with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exonet.validate import netns

STUDY = Path(__file__).resolve().parents[1] / "examples" / "torchrun_study.py"
STEPS = 8


@pytest.fixture(scope="module")
def hosts():
    why = netns.privilege()
    if why is not None:
        pytest.skip(f"two-host test: {why}")
    with netns.Network([netns.NodeLink(None), netns.NodeLink(None)]) as net:
        yield net
    assert not [name for _, name in netns.leftovers(include_live=True) if name.startswith(net.prefix)]


def _two_hosts(net: netns.Network, strategy: str, out: Path) -> dict:
    """Run the two-host torchrun command in both namespaces; rank 0's JSON summary."""
    procs = []
    for host in range(2):
        cmd = [*net.exec_prefix(host), sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{netns.address(0)}:29500",
               "--rdzv-id", f"exonet-{strategy}", "--rdzv-conf", f"is_host={int(host == 0)}",
               "--local-addr", netns.address(host), str(STUDY), "--strategy", strategy, "--steps", str(STEPS),
               "--json", str(out / f"host{host}.json")]
        # gloo binds to the namespace's own interface (the host name resolves outside the namespace)
        env = {**os.environ, "GLOO_SOCKET_IFNAME": net.iface(host)}
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for host, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"host {host}:\n{text[-4000:]}"
    written = [out / f"host{h}.json" for h in range(2) if (out / f"host{h}.json").exists()]
    assert len(written) == 1, written  # rank 0 lives on exactly one host
    return json.loads(written[0].read_text())


def _local(strategy: str, out: Path) -> dict:
    proc = subprocess.run([sys.executable, str(STUDY), "--strategy", strategy, "--nodes", "4", "--steps", str(STEPS),
                           "--json", str(out / "local.json")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "local.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "diloco"])
def test_two_hosts_match_the_local_run(hosts, strategy, tmp_path):
    got = _two_hosts(hosts, strategy, tmp_path)
    want = _local(strategy, tmp_path)
    assert len(got["train_loss"]) == STEPS
    assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-5)
    assert got["payload_bytes"] == want["payload_bytes"]
