"""The simulated clock (`clock` group): the families' per-step times, durations, jitter and refusals."""

import math

import pytest
import torch
from hydra.utils import instantiate

from conftest import compose_config
from fedagg.seeding import generator
from fedagg.run import train
from fedagg.system.clock import Clock, Exponential, HalfNormal, LogNormal, Uniform


def test_each_family_at_hand_computed_quantiles():
    # u = 0.5: the median of each family; Φ⁻¹(0.75) = 0.6744897501960817
    assert HalfNormal(min=0.5, sigma=2.0).quantile(0.5) == pytest.approx(0.5 + 2 * 0.6744897501960817)
    assert LogNormal(median=3.0, sigma=0.7).quantile(0.5) == pytest.approx(3.0)
    assert Exponential(mean=2.0).quantile(0.5) == pytest.approx(2.0 * math.log(2))
    assert Uniform(min=1.0, mean=2.0).quantile(0.5) == pytest.approx(2.0)
    # other quantiles: Φ(1) = 0.8413447460685429, so the lognormal gives median · e^σ; |N(0, σ)| at u = 0.95 is 1.96σ
    assert LogNormal(median=3.0, sigma=0.7).quantile(0.8413447460685429) == pytest.approx(3.0 * math.exp(0.7))
    assert HalfNormal(min=0.0, sigma=1.0).quantile(0.95) == pytest.approx(1.959963984540054)
    assert Exponential(mean=2.0).quantile(1 - math.exp(-3)) == pytest.approx(6.0)
    assert Uniform(min=1.0, mean=2.0).quantile(0.25) == pytest.approx(1.5)  # U(1, 3)


def test_connect_draws_each_client_from_its_own_stream():
    clock = LogNormal(median=2.0, sigma=0.5)
    clock.connect(seed=7, num_clients=5)
    for k in range(5):
        u = float(torch.rand(1, dtype=torch.float64, generator=generator(7, "clock", k)))
        assert clock.step_time(k) == pytest.approx(2.0 * math.exp(0.5 * torch.distributions.Normal(0, 1).icdf(
            torch.tensor(u, dtype=torch.float64)).item()))
    more = LogNormal(median=2.0, sigma=0.5)
    more.connect(seed=7, num_clients=50)  # a client's time does not depend on how many there are
    assert [more.step_time(k) for k in range(5)] == [clock.step_time(k) for k in range(5)]
    other = LogNormal(median=2.0, sigma=0.5)
    other.connect(seed=8, num_clients=5)
    assert [other.step_time(k) for k in range(5)] != [clock.step_time(k) for k in range(5)]
    # one u per client for every family: a client slow under one is slow under another
    half = HalfNormal(min=0.0, sigma=1.0)
    half.connect(seed=7, num_clients=5)
    order = lambda c: sorted(range(5), key=c.step_time)  # noqa: E731
    assert order(half) == order(clock)


def test_duration_is_steps_times_step_time_plus_upload():
    clock = Uniform(min=1.0, mean=1.0, upload_rate=1000.0)  # every client 1 s per step
    clock.connect(seed=0, num_clients=3)
    assert clock.step_time(2) == 1.0
    assert clock.duration(2, steps=5, bits_up=500, dispatch=1) == pytest.approx(5.5)
    free = Uniform(min=1.0, mean=1.0, upload_rate=None)
    free.connect(seed=0, num_clients=3)
    assert free.duration(0, steps=4, bits_up=10**9, dispatch=1) == 4.0  # no upload rate: uploads take no time


def test_jitter_is_a_draw_per_client_and_dispatch():
    clock = Uniform(min=2.0, mean=2.0, jitter=0.3)
    clock.connect(seed=5, num_clients=4)
    z = float(torch.randn(1, dtype=torch.float64, generator=generator(5, "clock_jitter", 3, 9)))
    assert clock.duration(3, steps=10, bits_up=0, dispatch=9) == pytest.approx(20.0 * math.exp(0.3 * z))
    assert clock.duration(3, 10, 0, 9) == clock.duration(3, 10, 0, 9)  # keyed, not a state: resume draws the same
    assert clock.duration(3, 10, 0, 9) != clock.duration(3, 10, 0, 10)
    assert clock.duration(3, 10, 0, 9) != clock.duration(2, 10, 0, 9)


def test_over_selection_counts():
    clock = LogNormal(deadline=10.0, over_select=0.3)
    assert clock.selected(10) == 13 and clock.selected(5) == 7  # ⌈6.5⌉
    assert LogNormal(deadline=10.0, over_select=0.2).selected(10) == 12  # 1.2 · 10 is 12.000000000000002 in floats
    assert LogNormal().selected(10) == 10


def test_none_has_no_time():
    clock = Clock()
    clock.connect(seed=0, num_clients=3)
    assert not clock.enabled and clock.deadline is None and clock.over_select == 0
    with pytest.raises(RuntimeError, match="clock=none has no simulated time"):
        clock.duration(0, 1, 0, 1)
    assert LogNormal().enabled


@pytest.mark.parametrize("override,message", [
    ("clock.sigma=0", "clock.sigma=0 is not allowed; it must be a finite number > 0"),
    ("clock.median=-1.0", "clock.median=-1.0 is not allowed; it must be a finite number > 0"),
    ("clock.jitter=-0.1", "clock.jitter=-0.1 is not allowed; it must be a finite number >= 0"),
    ("clock.upload_rate=-5", "clock.upload_rate=-5 is not allowed; it must be 0 or null (uploads take no time) or a "
                             "number of bits per second >= 1e-80"),
    ("clock.upload_rate=1e-300", "clock.upload_rate=1e-300 is not allowed; it must be 0 or null"),
    # the slowest client's step must stay a finite time: e^{1000 Φ⁻¹(1 − 1e-12)} and e^{9 · 1000} overflow
    ("clock.sigma=1000.0", "clock.median=1.0, clock.sigma=1000.0 are not allowed together: the slowest client's local "
                        "step would last more seconds than a float64 holds, and simulated times stay finite only up "
                        "to 1e+100 seconds a step; lower clock.median or clock.sigma"),
    ("clock.jitter=1000.0", "clock.median=1.0, clock.sigma=1.0, clock.jitter=1000.0 are not allowed together: the slowest "
                         "client's local step would last about 1e+3912 seconds"),
    ("clock.median=1e+308", "clock.median=1e+308, clock.sigma=1.0 are not allowed together"),
    ("clock=exponential clock.mean=1e+308", "clock.mean=1e+308 is not allowed: the slowest client's local step"),
    ("clock=half_normal clock.sigma=1e+308", "clock.min=0.0, clock.sigma=1e+308 are not allowed together"),
    ("server=async aggregator=fedbuff clock.median=1e+308", "clock.median=1e+308, clock.sigma=1.0 are not allowed"),
    ("clock.deadline=0", "clock.deadline=0 is not allowed; it must be a finite number of seconds > 0, or null"),
    ("clock.over_select=0.5", "clock.over_select=0.5 is not allowed with clock.deadline=null"),
    ("clock.over_select=-0.5", "clock.over_select=-0.5 is not allowed; it must be a finite number >= 0"),
])
def test_bad_settings_are_refused_in_one_line_before_training(tmp_path, override, message):
    with pytest.raises(ValueError) as err:  # SetupError, what the command line prints
        train(compose_config("rounds=1", "device=cpu", "dataset=digits", "clock=lognormal", *override.split()), tmp_path)
    assert type(err.value).__name__ == "SetupError"
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "metrics.csv").exists()


def test_the_slowest_step_is_bounded_where_the_arithmetic_needs_it():
    # the slowest client draws u = 1 − 1e-12: |N(0, σ)| there is σ Φ⁻¹(1 − 0.5e-12) = 7.1305σ, so σ = 1e99 times
    # stay below 1e100 seconds a step and σ = 1e100 do not; the jitter's largest factor is e^{9 · jitter}
    assert HalfNormal(sigma=1e99).quantile(1 - 1e-12) == pytest.approx(1e99 * 7.1305, rel=1e-4)
    with pytest.raises(ValueError, match=r"^clock.min=0.0, clock.sigma=1e\+100 are not allowed together: .* about 1e\+101 s"):
        HalfNormal(sigma=1e100)
    LogNormal(median=1.0, sigma=1.0, jitter=24.0)  # 7.03 + 9 · 24 = 223 < ln 1e100 = 230.3
    with pytest.raises(ValueError, match=r"clock.jitter=25.0 are not allowed together"):
        LogNormal(median=1.0, sigma=1.0, jitter=25.0)  # 7.03 + 225 = 232 > 230.3
    clock = LogNormal(median=1.0, sigma=1.0, jitter=24.0)
    clock.connect(seed=0, num_clients=2)
    assert all(math.isfinite(clock.duration(k, 10**9, 0, d)) for k in range(2) for d in range(200))


def test_uniform_refuses_min_above_mean():
    with pytest.raises(ValueError, match=r"clock.min=3.0 is not allowed with clock.mean=2.0; .* min must be at most mean"):
        Uniform(min=3.0, mean=2.0)


@pytest.mark.parametrize("name", ["none", "half_normal", "lognormal", "exponential", "uniform"])
def test_every_option_builds_with_its_defaults(name):
    clock = instantiate(compose_config(f"clock={name}").clock)
    clock.connect(seed=0, num_clients=4)
    if clock.enabled:
        assert all(clock.step_time(k) >= 0 for k in range(4))


def test_runs_written_before_the_clock_resume_as_clock_none():
    from fedagg.run import _changed_keys

    new = {"seed": 0, "clock": {"_target_": "fedagg.system.clock.Clock"}}
    assert _changed_keys({"seed": 0}, new) == []  # a run from before the group ran without time: clock=none
    assert _changed_keys({"seed": 0}, {"seed": 0, "clock": {"_target_": "fedagg.system.clock.LogNormal"}}) == ["clock"]
    assert _changed_keys({"seed": 0, "clock": {"_target_": "fedagg.system.clock.LogNormal"}}, new) == ["clock._target_"]
