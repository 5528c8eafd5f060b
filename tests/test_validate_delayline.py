"""The user-space delay line (exonet/validate/delayline.py) and the cases run through it (windows.py).

The scenario each case compares against is checked without privilege; the line itself, its teardown
and one window-limited gloo case need network namespaces (root) and skip, saying why, otherwise.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time

import pytest

from exonet.validate.delayline import DelayLine, DelayLink
from exonet.validate.netns import leftovers, privilege, remove_leftovers
from exonet.validate.windows import MIB, DelayCase, recorded, recorded_report, run_case, window

REASON = privilege()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"needs network namespaces: {REASON}")
# Nine runs of the CI case at load 2-10 gave medians of 1.974-2.020 s, 1.7-4.0% above the gloo model's 1.941 s
# (validate README); 8% leaves room for a busier CI machine, and the phase model (27% fast) still fails it.
TOLERANCE = 0.08
SYSCTLS = {"net.core.wmem_max": "4194304", "net.core.rmem_max": "4194304", "net.ipv4.tcp_wmem": "4096 16384 4194304",
           "net.ipv4.tcp_rmem": "4096 131072 33554432", "net.ipv4.tcp_slow_start_after_idle": "1",
           "net.ipv4.tcp_congestion_control": "reno"}


def test_a_stream_window_is_the_smaller_of_the_send_buffer_and_half_the_receive_buffer():
    """A bulk sender keeps 70% of its send buffer (tcp_wmem max) in flight; the receiver advertises half its own."""
    assert window(SYSCTLS) == int(0.7 * 4 * MIB)
    assert window({**SYSCTLS, "net.ipv4.tcp_rmem": "4096 131072 5242880"}) == int(2.5 * MIB)


def test_the_scenario_is_the_delay_lines_configuration_with_nothing_fitted():
    """Rate, one-way delay, IP framing on a TUN device (52 bytes per 1500), the tbf queue, the window the sysctls
    give, and slow start after idle as the congestion control does it (BBR skips Linux's restart)."""
    case = DelayCase(3, 150e6 / 8, 0.05, 16 * MIB)
    net = case.scenario("gloo", SYSCTLS).resolve(3)
    assert net.uplink == (18.75e6,) * 3 and net.latency == 0.05 and (net.mss, net.header_bytes) == (1448, 52)
    assert net.backend == "gloo" and net.tcp_window == int(0.7 * 4 * MIB) and net.slow_start
    assert net.queue == (int(18.75e6 * 0.2) + 32768, "bytes")
    bbr = {**SYSCTLS, "net.ipv4.tcp_congestion_control": "bbr"}
    assert not case.scenario("gloo", bbr).resolve(3).slow_start
    assert not case.scenario("gloo", {**SYSCTLS, "net.ipv4.tcp_slow_start_after_idle": "0"}).resolve(3).slow_start
    phase = case.scenario("phase", SYSCTLS).resolve(3)
    assert phase.backend is None and phase.tcp_window is None and phase.queue is None
    nccl = DelayCase(4, 100e6 / 8, 0.05, 12_000_000, transport="streams").scenario("nccl", SYSCTLS).resolve(4)
    assert nccl.streams == 16 and nccl.nccl.channels == 1
    steps = DelayCase(2, 400e6 / 8, 0.05, 64 * MIB, transport="streams", streams=1, slice_bytes=0)
    assert steps.model == "window" and steps.scenario("window", SYSCTLS).resolve(2).inflight == int(0.7 * 4 * MIB)
    with pytest.raises(ValueError, match="model must be one of"):
        case.scenario("tree", SYSCTLS)


def test_the_model_sees_the_warm_up_and_the_idle():
    """The replayed trace is the nodes' own: a warm-up on new connections (slow start, left out of the times),
    then the measured all-reduces; after 1 s idle (over the RTO) with restart on, each pays slow start again."""
    warm = DelayCase(2, 200e6 / 8, 0.05, 16 * MIB)
    idle = DelayCase(2, 200e6 / 8, 0.05, 16 * MIB, idle=1.0)
    assert warm.predict("gloo", SYSCTLS) < idle.predict("gloo", SYSCTLS)
    assert warm.predict("gloo", SYSCTLS) == pytest.approx(idle.predict("gloo", SYSCTLS, restart=False))


# ---------------------------------------------------------------- the line itself (root only)
_PING = r"""
import socket, sys, time
from exonet.validate.netns import address
if sys.argv[1] == "serve":
    s = socket.create_server((address(1), 29990))
    c = s.accept()[0]
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (b := c.recv(1)):
        c.sendall(b)
else:
    for _ in range(100):
        try:
            c = socket.create_connection((address(1), 29990))
            break
        except OSError:
            time.sleep(0.05)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(10):
        t = time.monotonic()
        c.sendall(b"x")
        c.recv(1)
        rtts.append(time.monotonic() - t)
    print(*sorted(rtts))
"""


def _mine(pid: int) -> list[str]:
    """Namespaces, links (TUN devices among them), qdiscs and processes that name ``pid``'s prefix."""
    prefix = f"exv{pid:x}-"
    found = [name for _, name in leftovers(include_live=True) if name.startswith(prefix)]
    found += [line for line in subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
              .splitlines() if prefix in line]
    procs = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return found + [p for p in procs if "exonet.validate.delayline" in p and prefix in p]


@needs_netns
def test_the_line_holds_each_packet_its_delay_each_way_and_leaves_nothing_behind():
    """D = 25 ms: a one-byte TCP ping-pong between two namespaces takes 50 ms (never less, the quickest of ten within
    2.5 ms); the line forwarded every packet late by under 5 ms, dropped nothing, and after the context nothing of it
    remains: no namespace, TUN device, qdisc or forwarder process."""
    with DelayLine(2, DelayLink(0.025, 100e6 / 8)) as net:
        server = subprocess.Popen([*net.exec_prefix(1), sys.executable, "-c", _PING, "serve"])
        out = subprocess.run([*net.exec_prefix(0), sys.executable, "-c", _PING, "ping"], capture_output=True,
                             text=True, timeout=60)
        server.wait(10)
        assert _mine(os.getpid())  # the line is there while it runs
        forwarder = net.forwarder.pid
    rtts = [float(x) for x in out.stdout.split()]
    print(f"\nRTTs {[round(r * 1e3, 2) for r in rtts]} ms, line {net.stats}")
    assert len(rtts) == 10, out.stderr
    # the endpoints are Python processes on a shared machine, which add their wake-ups: judge the quickest round
    # trip (never under 2D, within 2.5 ms of it) and the line's own lateness
    assert 0.050 <= rtts[0] <= 0.0525 and net.stats["late_max_s"] < 0.005
    assert net.stats["forwarded"] > 0 and net.stats["dropped"] == 0
    assert _mine(os.getpid()) == []
    with pytest.raises(ProcessLookupError):
        os.kill(forwarder, 0)


_HOLD = r"""
import time
from exonet.validate.delayline import DelayLine, DelayLink
with DelayLine(2, DelayLink(0.01, 50e6 / 8)) as net:
    print(net.forwarder.pid, flush=True)
    time.sleep(600)
"""


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_run_leaves_no_forwarder_tun_device_or_namespace(sig, ceiling_s):
    """SIGTERM: the run tears its line down itself. SIGKILL: the forwarder sees its parent's pipe close and exits,
    which removes the TUN devices; the namespaces are a dead process's leftovers, which the next run removes."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD], stdout=subprocess.PIPE, text=True)
    forwarder = int(proc.stdout.readline())
    ns, tun = f"exv{proc.pid:x}-n0", f"exv{proc.pid:x}-t0"
    assert ns in _mine(proc.pid) and tun in _links(ns)
    proc.send_signal(sig)
    proc.wait(ceiling_s)
    deadline = time.monotonic() + ceiling_s
    while time.monotonic() < deadline and _forwarder_alive(forwarder):
        time.sleep(0.1)
    assert not _forwarder_alive(forwarder)
    if sig == signal.SIGKILL:
        assert tun not in _links(ns)  # the TUN devices went with the forwarder; the namespaces wait for the next run
        remove_leftovers()
    assert _mine(proc.pid) == []


def _links(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "ip", "-o", "link"], capture_output=True, text=True).stdout


def _forwarder_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------- a case through it (root only)
@needs_netns
@pytest.mark.slow
def test_gloos_window_through_the_delay_line_is_modelled_and_the_phase_model_misses_it():
    """K = 3 at 150 Mbit/s, RTT 100 ms, a 16 MiB gloo all-reduce, five back to back after a warm-up. gloo keeps
    two 1 MiB segments in flight per pair, so its ring moves about 2 MiB per round trip plus a segment's time:
    that, not the link, sets the rate. backend = "gloo" models it; the window-less phase model is 28% fast."""
    case = DelayCase(3, 150e6 / 8, 0.05, 16 * MIB)
    late = []
    for _ in range(3):  # a run whose line fell behind measured the forwarder, not the network: run it again
        t0 = time.perf_counter()
        m = run_case(case)
        elapsed = time.perf_counter() - t0
        model, phase = m.predict(), m.predict("phase")
        lo, hi = m.spread
        print(f"\nreal {m.real:.3f} s (p10-p90 {lo:.3f}-{hi:.3f}, {m.times}), gloo {model:.3f} s, phase {phase:.3f} s, "
              f"line p99 late {m.late_p99 * 1e3:.2f} ms, load {m.load:.1f}, {elapsed:.0f} s")
        assert elapsed < 120
        late.append(f"{m.late_p99 * 1e3:.2f} ms at load {m.load:.1f}")
        if m.late_p99 < 0.002:  # the line kept its delay: the shaper, not the forwarder, was the bottleneck
            break
    else:
        pytest.fail(f"the delay line fell behind in every run (p99 late {', '.join(late)}; at most 2 ms expected)")
    # A run's repetitions share its connections and the ranks' phase, so their p10-p90 is narrow (about 1%); runs
    # moved their medians by TOLERANCE (see the validate README, "Delay: a user-space delay line"), so the model is
    # judged against the median widened by that.
    assert abs(model - m.real) <= TOLERANCE * m.real + max(m.real - lo, hi - m.real)
    assert (m.real - phase) / m.real > 0.20
    assert _mine(os.getpid()) == []


def test_the_delay_matrix_command_reports_the_line_and_every_table(monkeypatch, capsys):
    """``exonet validate --matrix delay`` measures the line's rate at D = 10, 25, 50 ms, then runs gloo's window,
    Linux's window, slow start after idle, the pipelined ring and sequences of calls, each case on two networks, and
    prints each
    table (the runs are stubbed: each case 'measures' its own model's time, so every model error is 0)."""
    from exonet.validate import command, delayline, netns, windows
    from exonet.validate.delayline import LineRate
    from exonet.validate.windows import DelayMeasurement

    stats = {"forwarded": 1, "dropped": 0, "late_p99_s": 1e-4, "late_max_s": 1e-3}
    monkeypatch.setattr(netns, "privilege", lambda: None)
    monkeypatch.setattr(delayline, "line_rate", lambda delay, shaped: LineRate(delay, shaped, 16, shaped * 7.5,
                                                                               stats, 0.5, 1.0))
    runs = []

    def measured(case: DelayCase, runs_: int) -> DelayMeasurement:
        runs.append(runs_)
        t = case.predict(case.model, SYSCTLS)
        return DelayMeasurement(case, [t] * 5, [t] * runs_, SYSCTLS, 1e-4, 1.0)

    monkeypatch.setattr(windows, "run_case", lambda case, runs: measured(case, runs))
    assert command.main(["--matrix", "delay"]) == 0
    out = capsys.readouterr().out
    assert out.count("| 10 | 250 | 16 | 234 | 0.10 | 1.0 | 0 | 50% | 1.0 |") == 1 and out.count("| 50 | 1000 |") == 1
    for title, cases in (("gloo's window", windows.window_limited()), ("Linux's window", windows.tcp_window()),
                         ("slow start after idle", windows.slow_start()),
                         ("the NCCL-like pipelined ring", windows.pipelined()),
                         ("sequences of calls", windows.sequences())):
        assert f"{len(cases)} cases ({title}" in out
    assert set(runs) == {2}
    assert out.count("model: median |error| 0.0%, worst 0.0%") == 5
    assert out.count("| after idle s (p10-p90) |") == 1 and out.count(", after 1 s idle |") >= 3


def test_the_model_meets_the_recorded_delay_line_medians():
    """The model against the delay line's measured medians (no root needed): in each run, on the deterministic
    cases (repeats within 5%), median |error| <= 3% and worst <= 10%, as the issue asks. Run 1 was measured after
    the model's revision from run 0's mechanisms, so it is out of sample; nothing is fitted to either."""
    errors = recorded_report(log=lambda line: None)
    for run in (0, 1):
        deterministic = errors[f"run {run} deterministic"]
        assert len(deterministic) >= 12 and statistics.median(deterministic) <= 0.03 and max(deterministic) <= 0.10


def test_sequences_of_small_calls_are_their_own_regime_and_within_the_issues_bound():
    """The delay line's sequences (run 2): 16 MiB as 1, 8 and 32 blocking gloo all-reduces at K = 3. The split ones
    spend their time in latency-bound calls, so their replays are in the library-calls regime, whose band they
    help measure; the model is within the bound asked of many calls (median |error| <= 10%, worst <= 25%)."""
    from exonet.netsim import confidence

    runs = [r for r in recorded() if r.run == 2]
    assert sorted(r.case.calls for r in runs) == [1, 1, 8, 8, 32, 32]
    errors = []
    for r in runs:
        replay = r.case.replay(r.case.model, r.sysctls)
        resolved = r.case.scenario(r.case.model, r.sysctls).resolve(r.case.k)
        if r.case.calls > 1:  # a single call is latency-bound only where gloo's window binds (at RTT 100 ms)
            assert confidence.regime(resolved, False, replay) == "library-calls"
        errors.append(abs(r.case.repetition_time(replay) - r.median) / r.median)
    assert statistics.median(errors) <= 0.10 and max(errors) <= 0.25, errors


@needs_netns
@pytest.mark.slow
def test_a_stage_boundarys_micro_batches_each_wait_for_their_receiver():
    """Two stages at 100 Mbit/s, RTT 50 ms, eight 4 kB micro-batches of 10 ms forwards, GPipe and 1F1B. gloo sends
    a message only once its receiver has posted the receive, so each micro-batch pays a round trip: the step
    takes about three times what a stream of eager messages would. The replay of the nodes' own traces meets the
    real time (measured within 1.1%; the bound leaves room for a loaded machine)."""
    from exonet.validate.stages import StageCase, run_case

    for schedule in ("gpipe", "1f1b"):
        m = run_case(StageCase(100e6 / 8, 0.025, 4096, 8, schedule))
        print(f"\n{m.case.name}: real {m.real:.3f} s ({m.times}), model {m.predict():.3f} s")
        assert abs(m.predict() - m.real) <= 0.05 * m.real
    assert _mine(os.getpid()) == []


def test_the_model_meets_the_recorded_stage_boundary_medians():
    """Every case of ``exonet validate --matrix stages`` as last measured (exonet/validate/stage_medians.json):
    the replay of its program, compute as asked, is within 3% of the measured median (within 1.4% when recorded;
    a model whose gloo messages start with their sender alone was up to 72% fast)."""
    from exonet.validate.stages import matrix, recorded

    cases = recorded()
    assert [case for case, _, _ in cases] == matrix()
    for case, median, sysctls in cases:
        assert abs(case.predict(sysctls) - median) <= 0.03 * median, case.name
