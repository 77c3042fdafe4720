"""FedAvg on small hand-computed tensors, and the contract every aggregator shares."""

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedagg.aggregators.base import FedAvg

W_GLOBAL = torch.tensor([1.0, 1.0, 1.0, 1.0])
W_CLIENTS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [2.0, 0.0, 0.0, -2.0], [0.0, 3.0, 0.0, 3.0]])
SAMPLES = torch.tensor([1, 2, 1])
IDS = torch.tensor([0, 1, 2])


def test_sample_weighting_matches_hand_computation():
    # D = [1/4, 1/2, 1/4]: 1/4*[1,2,3,4] + 1/2*[2,0,0,-2] + 1/4*[0,3,0,3]
    new = FedAvg().aggregate(W_GLOBAL, W_CLIENTS, SAMPLES, client_ids=IDS, round=1)
    assert torch.allclose(new, torch.tensor([1.25, 1.25, 0.75, 0.75]))


def test_uniform_weighting_is_the_plain_mean():
    agg = FedAvg(weighting="uniform")
    new = agg.aggregate(W_GLOBAL, W_CLIENTS, SAMPLES, client_ids=IDS, round=1)
    assert torch.allclose(new, torch.tensor([1.0, 5.0 / 3.0, 1.0, 5.0 / 3.0]))
    assert torch.allclose(agg.last_weights, torch.full((3,), 1.0 / 3.0))


def test_reports_the_weights_it_used():
    agg = FedAvg()
    agg.aggregate(W_GLOBAL, W_CLIENTS, SAMPLES, client_ids=IDS, round=1)
    assert torch.allclose(agg.last_weights, torch.tensor([0.25, 0.5, 0.25]))


def test_identical_clients_return_that_client_and_single_client_is_itself():
    same = W_CLIENTS[:1].repeat(3, 1)
    assert torch.equal(FedAvg().aggregate(W_GLOBAL, same, SAMPLES, client_ids=IDS, round=1), W_CLIENTS[0])
    one = FedAvg().aggregate(W_GLOBAL, W_CLIENTS[1:2], SAMPLES[1:2], client_ids=IDS[1:2], round=1)
    assert torch.equal(one, W_CLIENTS[1])


def test_unknown_weighting_names_key_value_and_choices():
    with pytest.raises(ValueError, match=r"aggregator.weighting='size'.*samples, uniform"):
        FedAvg(weighting="size")


def test_yaml_instantiates_ready_object():
    agg = instantiate(OmegaConf.load("conf/aggregator/fedavg.yaml"))
    assert isinstance(agg, FedAvg) and agg.weighting == "samples"
    assert agg.state_dict() == {}
