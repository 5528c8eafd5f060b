"""One 256 MiB fp32 all-reduce under the phase model, NCCL and gloo: the table of exonet/netsim/README.md.

Run: ``python examples/backends.py`` (under a second). Each row is K ranks, a one-way latency and a NIC
rate; NCCL runs with AWS's socket defaults (2 channels x 16 sockets), and each figure is a first call,
so new connections pay slow start.
"""

from __future__ import annotations

from exonet import Scenario, Trace, simulate

SIZE = 256 * 2**20


def rows() -> list[str]:
    """The table's rows: K, latency, rate, then seconds under the phase model, NCCL and gloo."""
    out = []
    for k in (4, 32):
        t = Trace(num_nodes=k)
        for r in range(k):
            t.add_collective(r, "all_reduce", SIZE)
        for delay in ("1 ms", "10 ms"):
            for rate in ("1 Gbit/s", "5 Gbit/s"):
                base = Scenario.from_dict({"name": "lan", "network": {"bandwidth": rate, "latency": delay}})
                phase = simulate(t, base).wall_clock_s
                nccl = simulate(t, base.replace(backend="nccl", nccl={"nic": "aws"})).wall_clock_s
                gloo = simulate(t, base.replace(backend="gloo")).wall_clock_s
                out.append(f"| {k} | {delay} | {rate} | {phase:.3f} | {nccl:.3f} | {gloo:.3f} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
