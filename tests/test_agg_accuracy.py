"""ABAVG, ACC_inverse and IDA against numpy transcriptions of SPEC "Accuracy and distance weighting"."""

import numpy as np
import pytest
import torch

from fedagg import RoundInputs
from fedagg.aggregators.accuracy import ABAVG, IDA, AccInverse
from fedagg.aggregators.inputs import Needs

W0 = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0])
CLIENTS = torch.tensor([[1.5, -0.5, 2.0, 0.3, 0.0], [0.0, -1.0, 3.0, 0.2, 1.5], [0.4, 0.5, 1.0, -0.6, 1.2]])
SAMPLES = torch.tensor([10, 30, 20])
IDS = torch.tensor([0, 1, 2])
ACC = torch.tensor([0.5, 0.25, 0.75])


def run(agg, W=CLIENTS, acc=ACC, n=SAMPLES, ids=IDS, w=W0):
    return agg.aggregate(RoundInputs.of(w, W, num_samples=n, client_ids=ids, val_acc=acc))


def combine(p):
    return np.asarray(p, np.float64) @ CLIENTS.numpy().astype(np.float64)  # new global = sum_k p_k W_k


def ida_weights(W, ref, eps=1e-8):
    d = np.linalg.norm(np.asarray(W, np.float64) - np.asarray(ref, np.float64), axis=1)
    if d.max() == 0:
        return np.full(len(d), 1 / len(d))
    inv = 1 / (d + eps)
    return inv / inv.sum()


@pytest.mark.parametrize(
    "agg, expected",
    [(ABAVG(), [0.5 / 1.5, 0.25 / 1.5, 0.75 / 1.5]),
     (AccInverse(), np.array([2.0, 4.0, 4 / 3]) / (2 + 4 + 4 / 3)),
     (AccInverse(eps=0.3), np.array([2.0, 1 / 0.3, 4 / 3]) / (2 + 1 / 0.3 + 4 / 3)),
     (IDA(), ida_weights(CLIENTS, CLIENTS.numpy().astype(np.float64).mean(0))),
     (IDA(eps=1.0), ida_weights(CLIENTS, CLIENTS.numpy().astype(np.float64).mean(0), eps=1.0)),
     (IDA(reference="global"), ida_weights(CLIENTS, W0))],
    ids=["abavg", "acc_inverse", "acc_inverse_floor", "ida_mean", "ida_large_eps", "ida_global"],
)
def test_weights_and_new_global_match_spec(agg, expected):
    res = run(agg)
    new = res.params
    assert np.allclose(res.weights.numpy(), expected, atol=1e-6)
    assert np.allclose(new.numpy(), combine(expected), atol=1e-5)
    assert (res.weights >= 0).all() and torch.allclose(res.weights.sum(), torch.tensor(1.0))


def test_the_weights_follow_accuracy_not_size():
    # same accuracies, different sizes: identical weights; and a swap of accuracies swaps the weights
    for agg in (ABAVG(), AccInverse()):
        res = run(agg, n=torch.tensor([1, 1, 1]))
        first = res.weights.clone()
        res = run(agg, n=torch.tensor([100, 1, 7]))
        assert torch.equal(res.weights, first)
        res = run(agg, acc=ACC.flip(0))
        # flipped accuracies are normalised by a sum taken in the other order: equal up to rounding
        torch.testing.assert_close(res.weights, first.flip(0), rtol=0, atol=1e-7)


def test_accuracy_guards():
    abavg = ABAVG()
    abavg_res = run(abavg, acc=torch.zeros(3))  # nobody validates: uniform, not 0/0
    out = abavg_res.params
    assert torch.equal(abavg_res.weights, torch.full((3,), 1 / 3)) and torch.isfinite(out).all()
    inv = AccInverse(eps=1e-8)
    inv_res = run(inv, acc=torch.tensor([0.0, 0.5, 0.25]))  # 1/max(acc, eps): 1e8, 2, 4
    assert np.allclose(inv_res.weights.numpy(), np.array([1e8, 2, 4]) / (1e8 + 6), rtol=1e-6)
    inv = AccInverse(eps=0.1)
    inv_res = run(inv, acc=torch.zeros(3))
    assert torch.allclose(inv_res.weights, torch.full((3,), 1 / 3))


def test_ida_guards():
    ida = IDA()
    ida_res = run(ida, W=CLIENTS[:1].repeat(3, 1))  # every distance 0: uniform
    same = ida_res.params
    assert torch.equal(ida_res.weights, torch.full((3,), 1 / 3)) and torch.allclose(same, CLIENTS[0], atol=1e-6)
    # client 2 sits on the mean: distance 0, weight 1/eps dominates but stays finite
    on_mean = torch.stack([CLIENTS[0], CLIENTS[1], (CLIENTS[0] + CLIENTS[1]) / 2])
    ida_res = run(ida, W=on_mean)
    assert torch.isfinite(ida_res.weights).all() and ida_res.weights[2] > 0.99
    glob = IDA(reference="global")
    assert torch.equal(run(glob, W=W0.repeat(3, 1)).params, W0)  # nobody moved: uniform over zero updates


@pytest.mark.parametrize("make", [ABAVG, AccInverse, IDA])
def test_identical_clients_and_single_client(make):
    agg = make()
    assert torch.allclose(run(agg, W=CLIENTS[1:2].repeat(3, 1)).params, CLIENTS[1], atol=1e-6)
    one = make()
    one_res = run(one, W=CLIENTS[1:2], acc=ACC[1:2], n=SAMPLES[1:2], ids=IDS[1:2])
    out = one_res.params
    assert torch.allclose(out, CLIENTS[1], atol=1e-6) and torch.equal(one_res.weights, torch.ones(1))
    assert agg.state_dict() == {}


def test_declared_needs_say_where_clients_are_scored():
    assert ABAVG().needs == Needs(val_acc="local") and IDA().needs == Needs()
    assert AccInverse(val_source="server", server_val_size=300).needs == Needs(val_acc="server", server_samples=300)
    with pytest.raises(ValueError, match=r"reads inputs.val_acc but does not declare it"):
        ABAVG().aggregate(RoundInputs.of(W0, CLIENTS, num_samples=SAMPLES))


@pytest.mark.parametrize(
    "make, kwargs, key",
    [(ABAVG, {"val_source": "remote"}, "val_source"), (ABAVG, {"server_val_size": 0}, "server_val_size"),
     (AccInverse, {"server_val_size": 2.5}, "server_val_size"), (AccInverse, {"eps": 0}, "eps"),
     (IDA, {"eps": -1e-8}, "eps"), (IDA, {"reference": "median"}, "reference")],
)
def test_bad_options_name_the_key(make, kwargs, key):
    with pytest.raises(ValueError, match=rf"aggregator\.{key}="):
        make(**kwargs)
