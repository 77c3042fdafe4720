"""FedAvg on small hand-computed tensors, and the contract every aggregator shares."""

import pytest
import torch

import fedagg
from fedagg import RoundInputs
from fedagg.aggregators.base import FedAvg

W_GLOBAL = torch.tensor([1.0, 1.0, 1.0, 1.0])
W_CLIENTS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [2.0, 0.0, 0.0, -2.0], [0.0, 3.0, 0.0, 3.0]])
SAMPLES = torch.tensor([1, 2, 1])
IDS = torch.tensor([0, 1, 2])


def test_sample_weighting_matches_hand_computation():
    # D = [1/4, 1/2, 1/4]: 1/4*[1,2,3,4] + 1/2*[2,0,0,-2] + 1/4*[0,3,0,3]
    new = FedAvg().aggregate(RoundInputs.of(W_GLOBAL, W_CLIENTS, num_samples=SAMPLES, client_ids=IDS, round=1)).params
    assert torch.allclose(new, torch.tensor([1.25, 1.25, 0.75, 0.75]))


def test_uniform_weighting_is_the_plain_mean():
    agg = FedAvg(weighting="uniform")
    res = agg.aggregate(RoundInputs.of(W_GLOBAL, W_CLIENTS, num_samples=SAMPLES, client_ids=IDS, round=1))
    new = res.params
    assert torch.allclose(new, torch.tensor([1.0, 5.0 / 3.0, 1.0, 5.0 / 3.0]))
    assert torch.allclose(res.weights, torch.full((3,), 1.0 / 3.0))


def test_reports_the_weights_it_used():
    agg = FedAvg()
    res = agg.aggregate(RoundInputs.of(W_GLOBAL, W_CLIENTS, num_samples=SAMPLES, client_ids=IDS, round=1))
    assert torch.allclose(res.weights, torch.tensor([0.25, 0.5, 0.25]))


def test_identical_clients_return_that_client_and_single_client_is_itself():
    same = W_CLIENTS[:1].repeat(3, 1)
    assert torch.equal(FedAvg().aggregate(RoundInputs.of(W_GLOBAL, same, num_samples=SAMPLES, client_ids=IDS, round=1)).params, W_CLIENTS[0])
    one = FedAvg().aggregate(RoundInputs.of(W_GLOBAL, W_CLIENTS[1:2], num_samples=SAMPLES[1:2], client_ids=IDS[1:2], round=1)).params
    assert torch.equal(one, W_CLIENTS[1])


def test_unknown_weighting_names_key_value_and_choices():
    with pytest.raises(ValueError, match=r"aggregator.weighting='size'.*samples, uniform"):
        FedAvg(weighting="size")


class InverseSize(fedagg.Aggregator):
    """Overrides only how clients are weighted: p_k proportional to 1 / n_k."""

    def client_weights(self, inputs: RoundInputs):
        inverse = 1.0 / inputs.num_samples.float()
        return inverse / inverse.sum()


def test_a_subclass_overriding_only_client_weights_gets_fedavgs_update_with_its_weights():
    agg = InverseSize()
    res = agg.aggregate(RoundInputs.of(W_GLOBAL, W_CLIENTS, num_samples=SAMPLES, client_ids=IDS))
    new = res.params
    p = torch.tensor([0.4, 0.2, 0.4])  # 1/n = [1, 1/2, 1], normalised
    assert torch.allclose(res.weights, p)
    assert torch.allclose(new, W_GLOBAL + p @ (W_CLIENTS - W_GLOBAL))  # w + sum_k p_k (W_k - w)
    assert torch.allclose(new, torch.tensor([0.8, 2.0, 1.2, 2.4]))  # by hand
    assert res.weights_for_buffers() is res.weights  # buffers follow the weights
