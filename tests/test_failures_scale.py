"""Failures at a million chips: the worker model (exonet.netsim.workers), its [failures] keys, the study."""

from __future__ import annotations

import math

import pytest

from exonet import Scenario
from exonet.bench import scale
from exonet.errors import ScenarioError
from exonet.netsim.workers import quorum_goodput, scenario_quorum_goodput, worker_goodput

HOUR = 3600.0


def failing(**failures: object) -> Scenario:
    return Scenario.from_dict({"name": "chips", "network": {"bandwidth": "1 Gbit/s"}, "failures": failures})


def toml(failures: str) -> str:
    return f'name = "chips"\n[network]\nbandwidth = "1 Gbit/s"\n\n[failures]\nmtbf = "8766 h"\n{failures}\n'


@pytest.mark.parametrize("elastic", [False, True])
def test_one_worker_keeps_the_closed_form_goodput_within_its_sampling_error(elastic):
    # 1,000 chips of mtbf 1,000 h: the worker fails once an hour and stalls 10 min each time
    stall = {"restart": "10 min"} if not elastic else {"pause": "10 min"}
    r = worker_goodput(failing(mtbf="1000 h", **stall), 1000, 1, elastic=elastic, horizon_s=2000 * HOUR)
    g = 1 / (1 + 600 / HOUR)  # g = 1 / (1 + d / MTBF), the worker's MTBF being mtbf / chips
    cycles = 2000 * HOUR / (HOUR + 600)
    assert r.goodput == pytest.approx(g, abs=4 * g * (1 - g) / math.sqrt(cycles))  # 4 sigma of the renewal sum
    assert r.failures == pytest.approx(cycles, rel=4 / math.sqrt(cycles))
    assert r.goodput + r.stalled + r.missing == pytest.approx(1.0) and r.missing == 0.0  # no slice is ever out


def test_an_elastic_worker_trains_without_the_failed_slice_until_the_repair():
    r = worker_goodput(failing(mtbf="1000 h", slice=10, repair="5 h"), 1000, 1, horizon_s=2000 * HOUR)
    # no pause: the only loss is the missing slices, R · slice / mtbf of the chips on average (Little's law)
    assert r.missing == pytest.approx(5 * 10 / 1000, rel=0.1) and r.stalled == 0.0
    # without elasticity, spares take the slice's place
    assert worker_goodput(failing(mtbf="1000 h", slice=10, repair="5 h"), 1000, 1, elastic=False,
                           horizon_s=2000 * HOUR).goodput == pytest.approx(1.0)


def test_a_failure_stalls_only_its_worker_so_more_workers_keep_more_goodput():
    s = failing(mtbf="8766 h", pause="20 s", slice=64, repair="2 h")
    goodputs = [worker_goodput(s, 1_200_000, m).goodput for m in (1, 4, 16)]
    assert goodputs == sorted(goodputs) and goodputs[2] - goodputs[0] > 0.3


def test_the_cost_is_the_failures_not_the_chips():
    s = failing(mtbf="8766 h", pause="20 s", slice=64, repair="2 h")
    figures = scale.worker_estimate(2_400_000, 16, 24.0)  # the bench's target: 60 s and 2 GiB
    assert figures["seconds"] < 60 and figures["peak_bytes"] < 2**30
    # chips fail while they train: a day of the trained share of 2.4M chips, at one failure a year each
    assert figures["failures"] == pytest.approx(2_400_000 * 24 / 8766 * figures["goodput"], rel=0.05)
    assert 0 < figures["goodput"] < 1
    assert worker_goodput(s, 2_400_000, 16).goodput == pytest.approx(figures["goodput"])


@pytest.mark.parametrize(("failures", "line", "says"), [
    ("slice = 0", 7, "failures.slice: expected an integer >= 1, got 0"),
    ('slice = "64"', 7, "failures.slice: expected an integer >= 1"),
    ("slices = 64", 7, "failures.slices: unknown key (did you mean 'slice'?)"),
    ('pause = "soon"', 7, "failures.pause:"),
    ('pause = "-1 s"', 7, "failures.pause:"),
    ('pasue = "20 s"', 7, "(did you mean 'pause'?)"),
])
def test_slice_and_pause_are_checked_naming_the_key_and_its_line(failures, line, says):
    with pytest.raises(ScenarioError) as err:
        Scenario.from_toml(toml(failures), "chips.toml")
    assert str(err.value).startswith(f"chips.toml:{line}: failures.") and says in str(err.value)


def test_a_slice_larger_than_a_worker_is_an_error_naming_the_key_and_its_line():
    s = Scenario.from_toml(toml('slice = 4096\npause = "20 s"'), "chips.toml")
    assert s.failures.slice == 4096 and s.failures.pause == 20.0
    worker_goodput(s, 65_536, 16, horizon_s=HOUR)  # 4,096 chips a worker: fits
    with pytest.raises(ScenarioError, match=r"^chips\.toml:7: failures\.slice: 4,096 devices is larger than a "
                                            r"worker \(65,536 chips / 32 workers = 2,048 devices\)"):
        worker_goodput(s, 65_536, 32)
    with pytest.raises(ScenarioError, match=r"^<dict>: failures\.slice: 4,096 devices"):  # no file: no line
        worker_goodput(failing(mtbf="8766 h", slice=4096), 1000)


def test_uneven_hardware_keeps_goodput_with_a_quorum_of_one_and_loses_it_waiting_for_all():
    speeds = [1.0] * 4 + [0.82] * 4  # four workers on chips 18% slower, and 10% speed noise
    assert quorum_goodput(speeds, 1, sigma=0.1) >= 0.97
    assert quorum_goodput(speeds, 8, sigma=0.1) == pytest.approx(0.84, abs=0.05)
    assert quorum_goodput([1.0] * 8, 8) == pytest.approx(1.0)  # equal speeds, no noise: nobody waits
    with pytest.raises(ValueError, match="quorum must be in"):
        quorum_goodput(speeds, 9)



def test_uneven_hardware_reads_from_the_scenario_a_real_run_would_use():
    uneven = Scenario.from_toml('name = "uneven"\n[network]\nbandwidth = "1 Gbit/s"\n\n[[nodes]]\n'
                                'ranks = [4, 5, 6, 7]\nspeed = 0.82\n\n[stragglers]\njitter = "lognormal"\n'
                                'sigma = 0.1\n', "uneven.toml")
    speeds = [1.0] * 4 + [0.82] * 4
    assert scenario_quorum_goodput(uneven, 8, 8) == quorum_goodput(speeds, 8, sigma=0.1)
    assert scenario_quorum_goodput(uneven, 8, 1) >= 0.97
    normal = uneven.replace(stragglers={"jitter": "normal"})
    with pytest.raises(ScenarioError, match="stragglers.jitter: the worker model draws lognormal"):
        scenario_quorum_goodput(normal, 8, 8)
