"""Updates are the contract: Δ against each client's start model, one definition for every helper, and the
diagnostics a rule returns reach metrics.csv as agg_ columns."""

import csv
import dataclasses

import pytest
import torch

from fedagg import RoundInputs, run_experiment
from fedagg.aggregators.base import FedAvg
from fedagg.aggregators.blocks import update_norms, weighted_update


def test_updates_are_against_the_start_model_and_computed_once():
    w = torch.tensor([1.0, 2.0])
    x = RoundInputs.of(w, torch.tensor([[4.0, 6.0], [1.0, 2.0]]))
    assert x.start_params is w  # a synchronous round: every client started from the global model
    assert torch.equal(x.updates, torch.tensor([[3.0, 4.0], [0.0, 0.0]])) and x.updates is x.updates
    assert torch.equal(update_norms(x), torch.tensor([5.0, 0.0]))


def test_a_start_model_per_client_gives_each_its_own_update():
    # client 0 started from (1, 2), client 1 from an older model (0, 0)
    x = RoundInputs.of(torch.tensor([1.0, 2.0]), torch.tensor([[4.0, 6.0], [1.0, 2.0]]),
                       start_params=torch.tensor([[1.0, 2.0], [0.0, 0.0]]))
    assert torch.equal(x.updates, torch.tensor([[3.0, 4.0], [1.0, 2.0]]))
    assert torch.equal(update_norms(x), torch.tensor([5.0, 5.0**0.5]))
    weights = torch.tensor([0.5, 0.5])
    assert torch.equal(weighted_update(weights, x), torch.tensor([2.0, 3.0]))
    # FedAvg steps from the global model with the mean of those updates
    assert torch.equal(FedAvg().aggregate(x).params, torch.tensor([3.0, 5.0]))
    blocked = dataclasses.replace(x, block_rows=1)  # column blocks compute the same Δ
    assert torch.equal(weighted_update(weights, blocked), torch.tensor([2.0, 3.0]))


def test_the_mean_update_passes_the_channels_server_side_before_the_server_step():
    seen = []

    def on_mean(mean):
        seen.append(mean.clone())
        return mean * 10

    x = RoundInputs.of(torch.zeros(2), torch.tensor([[1.0, 0.0], [0.0, 1.0]]), on_mean=on_mean)
    assert torch.equal(FedAvg().aggregate(x).params, torch.tensor([5.0, 5.0]))  # w + 10 * (0.5, 0.5)
    assert len(seen) == 1 and torch.equal(seen[0], torch.tensor([0.5, 0.5]))


def test_returned_metrics_reach_metrics_csv_as_agg_columns(tmp_path):
    run_experiment(["rounds=2", "device=cpu", "aggregator=fedexp"], tmp_path / "run")
    with open(tmp_path / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(float(r["agg_server_lr"]) >= 1.0 for r in rows)  # η_g = max(1, ...)
    assert rows[0]["agg_server_lr"] != rows[1]["agg_server_lr"]  # a value of each round, not one left over


@pytest.mark.parametrize("step", ["client_weights", "server_update"])
def test_a_step_may_return_its_diagnostics_beside_its_value(step):
    class Measured(FedAvg):
        def client_weights(self, inputs):
            weights = super().client_weights(inputs)
            return (weights, {"first": weights[0]}) if step == "client_weights" else weights

        def server_update(self, inputs, update):
            new = super().server_update(inputs, update)
            return (new, {"moved": update.abs().sum()}) if step == "server_update" else new

    out = Measured().aggregate(RoundInputs.of(torch.zeros(2), torch.tensor([[1.0, 0.0], [0.0, 3.0]])))
    assert torch.equal(out.params, torch.tensor([0.5, 1.5]))
    assert out.metrics == ({"first": 0.5} if step == "client_weights" else {"moved": 2.0})
    assert all(type(v) is float for v in out.metrics.values())
