"""What the loop supplies to aggregators for what they declare (val_acc, server split, label
histograms, local steps, client-half payloads), and the weights it records."""

import csv
import json
import math

import pytest
import torch

from conftest import compose_config
from fedagg import Aggregator, Needs, RoundInputs
from fedagg.clients.objectives import Objective
from fedagg.loop.diagnostics import round_diagnostics, weight_spread
from fedagg.run import train


class RecordingByAccuracy(Aggregator):
    """Weights clients by the validation accuracy the loop hands it, and remembers what it saw."""

    seen: list = []

    def __init__(self, val_source="local", server_val_size=0, weighting="samples"):
        super().__init__(weighting)
        self.needs = Needs(val_acc=val_source, server_samples=server_val_size if val_source == "server" else 0)

    def client_weights(self, inputs: RoundInputs):
        RecordingByAccuracy.seen.append((inputs.val_acc.clone(), inputs.num_samples.clone(),
                                         inputs.all_num_samples.clone()))
        return inputs.val_acc / inputs.val_acc.sum()


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _run(tmp_path, *overrides):
    RecordingByAccuracy.seen = []
    cfg = compose_config("rounds=2", "device=cpu", f"aggregator._target_={__name__}.RecordingByAccuracy", *overrides)
    return train(cfg, tmp_path)


def test_local_validation_split_is_held_out_by_default_and_scored(tmp_path):
    assert _run(tmp_path)["status"] == "completed"
    part = json.loads((tmp_path / "partition.json").read_text())
    sizes = torch.tensor([c["size"] for c in part["clients"]])
    val_acc, num_samples, all_num_samples = RecordingByAccuracy.seen[0]
    assert val_acc.shape == (10,) and bool(((val_acc >= 0) & (val_acc <= 1)).all()) and float(val_acc.min()) > 0.1
    # client.val_frac: null gives 10% of each client's data to validation, never to training
    assert torch.equal(num_samples, sizes - torch.round(sizes * 0.1).long())
    assert torch.equal(all_num_samples, num_samples)
    weights = [float(r["weight"]) for r in _rows(tmp_path / "weights.csv") if r["round"] == "2"]
    last_acc = RecordingByAccuracy.seen[1][0]
    assert weights == pytest.approx((last_acc / last_acc.sum()).tolist())


def test_server_split_is_removed_from_every_client(tmp_path):
    _run(tmp_path, "+aggregator.val_source=server", "+aggregator.server_val_size=100")
    part = json.loads((tmp_path / "partition.json").read_text())
    assert part["total"] == 1437 - 100
    val_acc = RecordingByAccuracy.seen[0][0]
    # every client is scored on the same 100 server samples: accuracies are multiples of 1/100
    assert torch.allclose(val_acc * 100, torch.round(val_acc * 100), atol=1e-4)


def test_explicit_zero_val_frac_with_local_scoring_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"client.val_frac=0.0; set client.val_frac"):
        _run(tmp_path, "client.val_frac=0.0")


def test_weights_csv_and_spread_columns_for_fedavg(tmp_path):
    train(compose_config("rounds=2", "device=cpu", "clients_per_round=4"), tmp_path)
    rows = _rows(tmp_path / "weights.csv")
    sizes = {c["id"]: c["size"] for c in json.loads((tmp_path / "partition.json").read_text())["clients"]}
    metrics = _rows(tmp_path / "metrics.csv")
    for r in (1, 2):
        mine = [x for x in rows if int(x["round"]) == r]
        assert len(mine) == 4
        total = sum(sizes[int(x["client"])] for x in mine)
        for x in mine:  # FedAvg weights are the data shares of this round's participants
            assert float(x["weight"]) == pytest.approx(sizes[int(x["client"])] / total)
        w = [float(x["weight"]) for x in mine]
        m = metrics[r - 1]
        assert float(m["weight_min"]) == pytest.approx(min(w)) and float(m["weight_max"]) == pytest.approx(max(w))
        assert float(m["weight_entropy"]) == pytest.approx(-sum(p * math.log(p) for p in w))


def test_diagnostics_on_hand_made_updates():
    old = torch.zeros(2)
    clients = torch.tensor([[3.0, 4.0], [0.0, 0.0]])  # ||d_1|| = 5, ||d_2|| = 0
    d = round_diagnostics(RoundInputs.of(old, clients), torch.tensor([1.5, 2.0]), torch.tensor([0.5, 0.5]))
    assert d["update_norm"] == pytest.approx(2.5) and d["client_update_norm"] == pytest.approx(2.5)
    assert weight_spread(torch.tensor([1.0, 0.0]))["weight_entropy"] == 0.0  # 0 log 0 = 0, not NaN
    assert weight_spread(torch.full((4,), 0.25))["weight_entropy"] == pytest.approx(math.log(4))


class RecordingHistAndServer(Aggregator):
    """Asks for label histograms and 50 server samples; remembers what it was given."""

    needs = Needs(label_hist=True, server_samples=50, server_data=True)
    seen: list = []

    def client_weights(self, inputs: RoundInputs):
        RecordingHistAndServer.seen.append((inputs.label_hist.clone(), inputs.global_label_hist.clone(),
                                            inputs.server.x.shape, inputs.server.y.clone(), inputs.val_acc))
        return super().client_weights(inputs)


def test_label_histograms_and_server_data_reach_the_aggregator(tmp_path):
    RecordingHistAndServer.seen = []
    cfg = compose_config("rounds=1", "device=cpu", "clients_per_round=4",
                         f"aggregator._target_={__name__}.RecordingHistAndServer", "~aggregator.weighting")
    summary = train(cfg, tmp_path)
    part = json.loads((tmp_path / "partition.json").read_text())
    hist, global_hist, x_shape, y, val_acc = RecordingHistAndServer.seen[0]
    chosen = [int(r["client"]) for r in _rows(tmp_path / "weights.csv")]
    assert hist.tolist() == [[float(c) for c in part["clients"][i]["class_counts"]] for i in chosen]
    assert global_hist.tolist() == [float(sum(c["class_counts"][j] for c in part["clients"])) for j in range(10)]
    assert x_shape == (50, 1, 8, 8) and y.shape == (50,) and part["total"] == 1437 - 50
    assert val_acc is None  # not declared, not computed
    assert summary["server_samples"] == 50 and summary["uses_extra_data"] is True


class StepsAndPayloads(Aggregator):
    """Declares local steps and a client half whose payload is each client's id and step count."""

    seen: list = []

    def __init__(self):
        super().__init__()
        self.needs = Needs(local_steps=True, client_half=Reporter())

    def client_weights(self, inputs: RoundInputs):
        StepsAndPayloads.seen.append((inputs.client_ids.clone(), inputs.local_steps.clone(),
                                      {k: v.clone() for k, v in inputs.payloads.items()}))
        return super().client_weights(inputs)


class Reporter(Objective):
    """A client half that adds nothing to the loss and sends its id, steps, lr and trained-parameter sum."""

    def after_training(self, client_id, trained, global_params, work):
        return {"id": torch.tensor(client_id), "steps": torch.tensor(work.steps), "lr": torch.tensor(work.lr),
                "moved": (trained - global_params).abs().sum()}


@pytest.mark.parametrize("engine", ["sequential", "parallel"])
def test_local_steps_and_client_half_payloads_reach_the_aggregator_by_client(tmp_path, engine):
    StepsAndPayloads.seen = []
    cfg = compose_config("rounds=2", "device=cpu", "clients_per_round=4", "client.batch_size=16", f"engine={engine}",
                         f"aggregator._target_={__name__}.StepsAndPayloads", "~aggregator.weighting")
    train(cfg, tmp_path)
    sizes = {c["id"]: c["size"] for c in json.loads((tmp_path / "partition.json").read_text())["clients"]}
    for ids, steps, payloads in StepsAndPayloads.seen:
        # two local epochs of ceil(n / 16) steps each; the payload rows follow the same client order
        assert steps.tolist() == [2 * -(-sizes[i] // 16) for i in ids.tolist()]
        assert payloads["id"].tolist() == ids.tolist() and payloads["steps"].tolist() == steps.tolist()
        assert payloads["lr"].tolist() == pytest.approx([0.05] * 4) and bool((payloads["moved"] > 0).all())


def test_a_method_with_a_client_half_runs_it_and_refuses_a_second_objective(tmp_path):
    summary = train(compose_config("rounds=2", "device=cpu", "clients_per_round=4", "aggregator=feddyn"), tmp_path / "a")
    assert summary["status"] == "completed"
    ckpt = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    chosen = {int(r["client"]) for r in _rows(tmp_path / "a" / "weights.csv")}
    # the client half kept a gradient state for exactly the clients that trained
    assert set(ckpt["trainer"]["objective"]["grad_state"]["inline"]) == chosen
    with pytest.raises(ValueError, match=r"brings its own client half \(FedDynClient\); client objective FedProx "
                                         r"cannot be added to it: use client/objective=none"):
        train(compose_config("rounds=1", "aggregator=feddyn", "client/objective=fedprox"), tmp_path / "b")
    with pytest.raises(ValueError, match=r"client/objective=feddyn is not a choice of its own any more: feddyn is one "
                                         r"method with both halves; use aggregator=feddyn"):
        train(compose_config("rounds=1", "aggregator=feddyn", "client/objective=feddyn"), tmp_path / "c")


class Unstackable(Objective):
    stackable = False


def test_parallel_engine_refuses_an_objective_it_cannot_stack(tmp_path):
    cfg = compose_config("rounds=1", "engine=parallel", f"client.objective._target_={__name__}.Unstackable")
    with pytest.raises(ValueError, match=r"^engine=parallel cannot stack client objective Unstackable \(it declares "
                                         r"stackable = False\); use engine=sequential$"):
        train(cfg, tmp_path)
    assert not (tmp_path / "metrics.csv").exists()


class ReportsRound(Aggregator):
    """Reports its round and participant count each round."""

    def client_weights(self, inputs: RoundInputs):
        return super().client_weights(inputs), {"round": inputs.round, "clients": inputs.num_clients}


class RecordingTracker:
    logged: list = []

    def start(self, run_dir, config, name):
        RecordingTracker.logged = []

    def log_image(self, key, path):
        pass

    def log_round(self, round, metrics):
        RecordingTracker.logged.append((round, metrics))

    def finish(self, summary):
        pass


def test_reported_diagnostics_become_agg_columns_and_reach_the_tracker_every_round(tmp_path):
    cfg = compose_config("rounds=3", "eval_every=2", "device=cpu", "clients_per_round=4",
                         f"aggregator._target_={__name__}.ReportsRound", f"logger._target_={__name__}.RecordingTracker")
    train(cfg, tmp_path)
    rows = _rows(tmp_path / "metrics.csv")  # evaluated rounds only: 2 (eval_every) and 3 (the last)
    assert [(r["round"], r["agg_round"], r["agg_clients"]) for r in rows] == [("2", "2.0", "4.0"), ("3", "3.0", "4.0")]
    assert [(r, m["agg_round"]) for r, m in RecordingTracker.logged] == [(1, 1.0), (2, 2.0), (3, 3.0)]
