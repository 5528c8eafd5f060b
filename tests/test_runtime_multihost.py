"""Two hosts for real: two network namespaces joined by a bridge, torchrun on each, c10d rendezvous.

Each namespace runs ``torchrun --nnodes 2 --nproc-per-node 2`` on examples/torchrun_study.py,
the README's two-host command, with the rendezvous on the first namespace's address.
DDP and DiLoCo must give the local run's loss curve and payload bytes (same seed, K=4), and so
must SparseLoCo swapping its messages through an S3 bucket (``fit(object_store="s3://...")``) served
by moto inside the first namespace, which both hosts reach over the bridge as they would a real endpoint.
Namespaces come from exonet.validate.netns; the test needs root (it tries to make a
scratch namespace) and skips with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from exonet.validate import netns

STUDY = Path(__file__).resolve().parents[1] / "examples" / "torchrun_study.py"
STEPS = 8
S3_PORT = 9000  # moto's, inside namespace 0 (the rendezvous has 29500 there)
BUCKET = "exonet"


@pytest.fixture(scope="module")
def hosts():
    why = netns.privilege()
    if why is not None:
        pytest.skip(f"two-host test: {why}")
    with netns.Network([netns.NodeLink(None), netns.NodeLink(None)]) as net:
        yield net
    assert not [name for _, name in netns.leftovers(include_live=True) if name.startswith(net.prefix)]


def _two_hosts(net: netns.Network, strategy: str, out: Path, *extra: str, env: dict[str, str] | None = None) -> dict:
    """Run the two-host torchrun command in both namespaces (``extra`` arguments to the study, ``env`` instead of
    this process's environment); rank 0's JSON summary."""
    procs = []
    for host in range(2):
        cmd = [*net.exec_prefix(host), sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{netns.address(0)}:29500",
               "--rdzv-id", f"exonet-{strategy}", "--rdzv-conf", f"is_host={int(host == 0)}",
               "--local-addr", netns.address(host), str(STUDY), "--strategy", strategy, "--steps", str(STEPS),
               "--json", str(out / f"host{host}.json"), *extra]
        # gloo binds to the namespace's own interface (the host name resolves outside the namespace)
        host_env = {**(os.environ if env is None else env), "GLOO_SOCKET_IFNAME": net.iface(host)}
        procs.append(subprocess.Popen(cmd, env=host_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
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


def _boto3_on_host0(net: netns.Network, env: dict[str, str], code: str) -> str:
    """Run ``code`` with a boto3 client ``s3`` inside namespace 0, where the server listens (the root namespace,
    this test's, has no address on the bridge); what it prints."""
    proc = subprocess.run([*net.exec_prefix(0), sys.executable, "-c", f"import boto3\ns3 = boto3.client('s3')\n{code}"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.fixture
def bucket(hosts: netns.Network) -> Iterator[dict[str, str]]:
    """A moto S3 server inside namespace 0 holding an empty bucket; the environment that points AWS clients at it
    (dummy credentials, no profile, as conftest's ``moto_s3``). The server is stopped however the test ends."""
    env = {key: value for key, value in os.environ.items() if key not in ("AWS_PROFILE", "AWS_SESSION_TOKEN")}
    env.update({"AWS_ENDPOINT_URL": f"http://{netns.address(0)}:{S3_PORT}", "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
    # `ip netns exec` execs the server: this process is the server itself
    server = subprocess.Popen([*hosts.exec_prefix(0), sys.executable, "-m", "moto.server", "-H", netns.address(0),
                               "-p", str(S3_PORT)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # nothing listens until the server is up: botocore retries the refused connections, backing off
        _boto3_on_host0(hosts, {**env, "AWS_RETRY_MODE": "standard", "AWS_MAX_ATTEMPTS": "10"},
                        f"s3.create_bucket(Bucket={BUCKET!r})")
        yield env
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_two_hosts_share_an_s3_bucket_as_the_local_run_shares_a_directory(hosts, bucket, tmp_path):
    """SparseLoCo's nodes on two hosts swap their messages through ``fit(object_store="s3://exonet/run")``: the
    same losses and payload bytes as K=4 processes here swapping through a directory, and every message
    (2 rounds x 4 ranks) really is an object in the bucket, under a prefix of the fit's own below ``run/``.
    The same command runs twice (same run id): the second fit must not meet the first's objects."""
    want = _local("sparseloco", tmp_path)
    for run in range(2):
        (out := tmp_path / f"run{run}").mkdir()  # rank 0's host may change: each run's summaries apart
        got = _two_hosts(hosts, "sparseloco", out, "--object-store", f"s3://{BUCKET}/run", env=bucket)
        assert len(got["train_loss"]) == STEPS
        assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-5)
        assert got["payload_bytes"] == want["payload_bytes"] and min(want["payload_bytes"]) > 0
    listing = f"print(json.dumps([o['Key'] for o in s3.list_objects_v2(Bucket={BUCKET!r}).get('Contents', [])]))"
    fits: dict[str, list[str]] = {}  # run/exonet-<run id>/fit-<fit id>: its messages
    for key in json.loads(_boto3_on_host0(hosts, bucket, f"import json\n{listing}")):
        fit, *name = key.rsplit("/", 3)
        fits.setdefault(fit, []).append("/".join(name))
    assert len(fits) == 2 and all(fit.startswith("run/exonet-") for fit in fits), fits
    for names in fits.values():
        assert sorted(names) == [f"sparseloco/round{r}/rank{j}" for r in (1, 2) for j in range(4)]
