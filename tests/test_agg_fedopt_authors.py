"""The FedOpt family's options for the authors' code (Reddi et al. 2021, google-research/federated)
against transcriptions of the Keras server steps that code ran, over four rounds.

Where each step comes from (the transcriptions below are written from these, in plain Python):
- The server applies its optimizer to -Delta, the negated mean client change:
  google-research/federated@49a4345:optimization/shared/fed_avg_schedule.py:98-104.
- FedAdagrad = tf.keras.optimizers.Adagrad with initial_accumulator_value 0.0, FedYogi = the
  repository's Yogi with initial_accumulator_value 0.0, FedAdam = Keras Adam (its v starts at 0),
  FedAvgM = Keras SGD with momentum 0.9: google-research/federated@49a4345:
  optimization/shared/optimizer_utils.py:37, optimization/README.md:95-98,111, and
  @a5af8c4:optimization/docs/hyperparameters.md:100-103; beta1, beta2 kept at Keras's 0.9, 0.999
  (ibid. :126).
- Keras Adagrad: accum += g^2; var -= lr g / (sqrt(accum) + eps), no first moment:
  keras-team/keras@a3a096d:keras/optimizer_v2/adagrad.py:65-68,136 (tf.raw_ops.ResourceApplyAdagradV2).
- Keras Adam: lr_t = lr sqrt(1 - b2^t) / (1 - b1^t); var -= lr_t m / (sqrt(v) + eps) with m, v the
  uncorrected moments: keras-team/keras@a3a096d:keras/optimizer_v2/adam.py:136-137,219-221.
- Yogi: v += (1 - b2) sign(g^2 - v) g^2; the same lr_t and eps placement as Adam:
  google-research/federated@49a4345:optimization/shared/keras_optimizers/yogi.py:129,178-187.
- Keras SGD momentum: velocity = mu velocity - lr g; w += velocity:
  keras-team/keras@a3a096d:keras/optimizer_v2/gradient_descent.py:35-36.
"""

import math

import pytest
import torch

from fedagg import RoundInputs
from fedagg.aggregators.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi

W0 = [0.3, -0.7, 1.2, 0.0]
# Four rounds of two clients' changes (weights 1:3). Element 3 never moves; element 0's mean
# change flips sign and shrinks, so Yogi's sign(g^2 - v) takes both values; the changes are of
# the order of sqrt(v) and tau = 0.01, so where tau sits changes the step.
DELTAS = [
    [[0.04, -0.02, 0.01, 0.0], [0.02, 0.03, -0.05, 0.0]],
    [[-0.01, 0.05, 0.02, 0.0], [-0.03, 0.01, -0.01, 0.0]],
    [[0.002, -0.04, 0.03, 0.0], [0.001, 0.02, 0.02, 0.0]],
    [[0.05, 0.01, -0.02, 0.0], [0.03, -0.01, 0.04, 0.0]],
]
SAMPLES = [1, 3]


def mean_change(round_deltas):
    total = sum(SAMPLES)
    return [sum(n * row[i] for n, row in zip(SAMPLES, round_deltas)) / total for i in range(len(W0))]


def run(agg):
    """Feed the rounds to `agg`; every round's new global as lists."""
    w, outs = torch.tensor(W0, dtype=torch.float64), []
    for r, d in enumerate(DELTAS, start=1):
        clients = w + torch.tensor(d, dtype=torch.float64)
        w = agg.aggregate(RoundInputs.of(w, clients, num_samples=torch.tensor(SAMPLES), client_ids=torch.tensor([0, 1]), round=r)).params
        outs.append(w.tolist())
    return outs


def keras_adagrad(lr, eps, accum0=0.0):
    w, accum, outs = list(W0), [accum0] * len(W0), []
    for d in DELTAS:
        grad = [-x for x in mean_change(d)]  # the server's "gradient" is the negated change
        for i, g in enumerate(grad):
            accum[i] += g * g
            w[i] -= lr * g / (math.sqrt(accum[i]) + eps)
        outs.append(list(w))
    return outs


def keras_adam_or_yogi(rule, lr, eps, b1=0.9, b2=0.999):
    w, m, v, outs = list(W0), [0.0] * len(W0), [0.0] * len(W0), []
    for t, d in enumerate(DELTAS, start=1):
        lr_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        for i, g in enumerate(-x for x in mean_change(d)):
            m[i] = b1 * m[i] + (1 - b1) * g
            if rule == "adam":
                v[i] = b2 * v[i] + (1 - b2) * g * g
            else:  # yogi: move v towards g^2 by (1 - b2) g^2
                v[i] += (1 - b2) * math.copysign(1.0, g * g - v[i]) * g * g if g * g != v[i] else 0.0
            w[i] -= lr_t * m[i] / (math.sqrt(v[i]) + eps)
        outs.append(list(w))
    return outs


def keras_sgd_momentum(lr, mu):
    w, velocity, outs = list(W0), [0.0] * len(W0), []
    for d in DELTAS:
        for i, g in enumerate(-x for x in mean_change(d)):
            velocity[i] = mu * velocity[i] - lr * g
            w[i] += velocity[i]
        outs.append(list(w))
    return outs


def same(outs, refs, tol=1e-12):
    for out, ref in zip(outs, refs, strict=True):
        assert out == pytest.approx(ref, abs=tol, rel=tol), (out, ref)


def differ(outs, refs, by):
    assert max(abs(a - b) for out, ref in zip(outs, refs) for a, b in zip(out, ref)) > by


AUTHORS = {"bias_correction": True, "correction": "rate", "v_init": 0.0, "beta2": 0.999}


@pytest.mark.parametrize("cls, rule", [(FedAdam, "adam"), (FedYogi, "yogi")])
@pytest.mark.parametrize("lr, tau", [(0.1, 0.01), (10**-2.5, 1e-4), (1.0, 0.1)])
def test_rate_correction_is_the_keras_step(cls, rule, lr, tau):
    outs = run(cls(lr=lr, tau=tau, **AUTHORS))
    same(outs, keras_adam_or_yogi(rule, lr, tau))
    # the PyTorch/FedCAMS placement of tau is a different method on these values
    differ(run(cls(lr=lr, tau=tau, **{**AUTHORS, "correction": "moments"})), outs, by=1e-4 * lr)


@pytest.mark.parametrize("lr, tau", [(0.1, 0.01), (10**-1, 1e-2), (10**-0.5, 0.1)])
def test_fedadagrad_without_momentum_from_zero_is_keras_adagrad(lr, tau):
    outs = run(FedAdagrad(lr=lr, tau=tau, beta1=0.0, v_init=0.0))
    same(outs, keras_adagrad(lr, tau))
    differ(run(FedAdagrad(lr=lr, tau=tau)), outs, by=1e-3 * lr)  # the paper's form: momentum, v from tau^2


def test_v_init_is_where_v_starts():
    # Keras's own Adagrad default starts at 0.1: v_init carries any start, not only 0
    same(run(FedAdagrad(lr=0.1, tau=0.01, beta1=0.0, v_init=0.1)), keras_adagrad(0.1, 0.01, accum0=0.1))
    agg = FedAdam(tau=0.05)  # null: the paper's tau^2
    run(agg)
    assert agg.v_init == pytest.approx(0.05**2)
    assert FedAdam(tau=0.05, bias_correction=True).v_init == 0.0  # null: 0 with bias correction, as before


def test_fedavgm_is_keras_sgd_with_momentum():
    same(run(FedAvgM(lr=10**-0.5, momentum=0.9)), keras_sgd_momentum(10**-0.5, 0.9))


def test_first_step_by_hand():
    # With tau = 0 and v from 0 the first Keras Adam / Yogi / Adagrad step is lr * sign(mean change):
    # Adam: m = 0.1 g, v = 0.001 g^2, lr_t = lr sqrt(0.001) / 0.1, so lr_t m / sqrt(v) = lr sign(g).
    # Round 1's mean change is (0.025, 0.0175, -0.035, 0): the new global is W0 + lr (1, 1, -1, 0).
    lr = 0.2
    expected = [0.3 + lr, -0.7 + lr, 1.2 - lr, 0.0]
    for agg in (FedAdam(lr=lr, tau=0.0, **AUTHORS), FedYogi(lr=lr, tau=0.0, **AUTHORS),
                FedAdagrad(lr=lr, tau=0.0, beta1=0.0, v_init=0.0)):
        assert run(agg)[0] == pytest.approx(expected, abs=1e-12)
    # With tau = 0.01 the placements part, element 0 (g = 0.025): the rate form moves
    # 0.2 sqrt(0.001) 0.025 / (sqrt(0.001) 0.025 + 0.01) = 0.0146529..., the moments form
    # 0.2 * 0.025 / (0.025 + 0.01) = 0.1428571...
    rate = run(FedAdam(lr=lr, tau=0.01, **AUTHORS))[0][0] - 0.3
    moments = run(FedAdam(lr=lr, tau=0.01, **{**AUTHORS, "correction": "moments"}))[0][0] - 0.3
    assert rate == pytest.approx(0.0146529, abs=1e-7) and moments == pytest.approx(0.1428571, abs=1e-7)


def test_without_bias_correction_the_correction_key_changes_nothing():
    same(run(FedYogi(lr=0.1, tau=0.01, correction="rate")), run(FedYogi(lr=0.1, tau=0.01)), tol=0.0)


@pytest.mark.parametrize("kwargs, key, words", [
    ({"correction": "keras"}, "correction", "choose one of moments, rate"),
    ({"v_init": -0.1}, "v_init", "use a number in [0, 1e+38]"),
])
def test_bad_option_values_are_refused_in_one_line(kwargs, key, words):
    value = next(iter(kwargs.values()))
    with pytest.raises(ValueError) as info:
        FedAdam(**kwargs)
    message = str(info.value)
    assert message.startswith(f"aggregator.{key}={value!r} is not allowed") and words in message and "\n" not in message
