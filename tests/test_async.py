"""The asynchronous server (server=async): FedAsync and FedBuff against hand computations and their authors'
code, the driver against synchronous FedAvg and hand-built sequences, engines, resume and refusals.

Sources transcribed: FedAsync xcgoner/async_fl@912ecf3 train_cifar10_mxnet_fedasync_singlethread_impl.py:256-284;
FedBuff facebookresearch/FLSim@7311f2d flsim/optimizers/async_aggregators.py:421-435, 482-494,
flsim/utils/async_trainer/async_staleness_weights.py:39-42, 102-105, flsim/reducers/base_round_reducer.py:173-224.
"""

import csv
import json
import math

import pytest
import torch

from conftest import compose_config
from fedagg.aggregators.asynchronous import staleness_weight
from fedagg.aggregators.fedasync import FedAsync
from fedagg.aggregators.fedbuff import FedBuff
from fedagg.aggregators.fedopt import FedAdam
from fedagg.aggregators.inputs import RoundInputs
from fedagg.seeding import generator
from fedagg.engines.base import RoundJob
from fedagg.models.flat import get_params
from fedagg.run import SetupError, prepare, run_experiment, train

DIGITS = ["device=cpu", "partition=iid", "eval_every=1"]
EQUAL_CLOCK = ["clock=uniform", "clock.min=1.0", "clock.mean=1.0"]  # every client 1 s a step: all equally fast


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def inputs(w, x, staleness, start=None, buffers=None):
    x = torch.as_tensor(x, dtype=torch.float64)
    k = x.shape[0]
    extra = {} if buffers is None else {"global_buffers": buffers[0], "client_buffers": buffers[1]}
    return RoundInputs.of(torch.as_tensor(w, dtype=torch.float64), x,
                          start_params=None if start is None else torch.tensor(start, dtype=torch.float64),
                          staleness=torch.tensor(staleness), **extra)


# -- staleness functions, by hand -----------------------------------------------------------------------------
def test_staleness_functions_by_hand():
    k = torch.tensor([0, 1, 3, 4, 5, 6])
    assert staleness_weight("constant", k, 0.5, 4).tolist() == [1.0] * 6
    poly = staleness_weight("polynomial", k, 0.5, 4).tolist()  # (k+1)^-1/2
    assert poly == pytest.approx([1, 1 / math.sqrt(2), 0.5, 1 / math.sqrt(5), 1 / math.sqrt(6), 1 / math.sqrt(7)],
                                 abs=1e-15)
    hinge = staleness_weight("hinge", k, 10.0, 4.0).tolist()  # 1 up to b = 4, then 1 / (10 (k - 4) + 1)
    assert hinge == pytest.approx([1, 1, 1, 1, 1 / 11, 1 / 21], abs=1e-15)


def authors_alpha(alpha, delay, alpha_type, adaptive, adaptive2):
    """xcgoner/async_fl@912ecf3 train_cifar10_mxnet_fedasync_singlethread_impl.py:258-281, transcribed."""
    if alpha_type == "power":
        alpha_factor = 1 / math.pow(delay + 1.0, adaptive) if adaptive > 0 else 1
    elif alpha_type == "hinge":
        if delay <= adaptive2:
            alpha_factor = 1
        else:
            alpha_factor = 1.0 / ((delay - adaptive2) * adaptive + 1)
    else:
        alpha_factor = 1
    return alpha * alpha_factor


@pytest.mark.parametrize("ours, theirs, a, b", [("constant", "none", None, 4.0), ("polynomial", "power", 0.5, 4.0),
                                                ("hinge", "hinge", 10.0, 4.0), ("hinge", "hinge", 2.0, 1.0)])
def test_fedasync_equals_the_authors_mixing(ours, theirs, a, b):
    """A sequence of arrivals of several staleness values: the authors' α_t and
    `weight = param_server * (1-alpha_scaled) + weight * alpha_scaled` (line 284), step by step."""
    rule = FedAsync(alpha=0.8, staleness=ours, a=a, b=b)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, dtype=torch.float64, generator=g)
    theirs_w = w.clone()
    for delay in [0, 3, 1, 7, 5, 12]:
        x = torch.randn(5, dtype=torch.float64, generator=g)
        out = rule.aggregate(inputs(w, x.unsqueeze(0), [delay], buffers=(torch.zeros(0), torch.zeros(1, 0))))
        alpha_scaled = authors_alpha(0.8, delay, theirs, a or 0.0, b)
        theirs_w = theirs_w * (1 - alpha_scaled) + x * alpha_scaled
        assert out.metrics["alpha"] == pytest.approx(alpha_scaled, abs=1e-15)
        assert torch.allclose(out.params, theirs_w, rtol=0, atol=1e-12)
        w = out.params


def test_fedasync_by_hand_mixes_models_and_buffers():
    # alpha 0.6, polynomial a = 0.5, staleness 1: alpha_t = 0.6 / sqrt(2) = 0.42426...
    rule = FedAsync()
    out = rule.aggregate(inputs([1.0, 2.0], [[3.0, 6.0]], [1], start=[[9.0, 9.0]],
                                buffers=(torch.tensor([10.0]), torch.tensor([[20.0]]))))
    at = 0.6 / math.sqrt(2)
    assert out.params.tolist() == pytest.approx([1 + 2 * at, 2 + 4 * at], abs=1e-12)  # the start plays no part
    assert out.buffers.tolist() == pytest.approx([10 + 10 * at], abs=1e-5)
    assert out.weights.tolist() == [1.0]
    assert FedAsync(staleness="hinge").a == 10.0 and FedAsync().a == 0.5  # the functions' defaults


def test_fedbuff_by_hand_weights_stale_updates_and_divides_by_k():
    # Δ1 = [1, 0] (fresh), Δ2 = [0, 2] (3 steps stale: s = 1/2); (1/2)(Δ1 + Δ2/2) = [0.5, 0.5]
    start = [[1.0, 1.0], [5.0, 5.0]]
    out = FedBuff(buffer_size=2).aggregate(inputs([0.0, 0.0], [[2.0, 1.0], [5.0, 7.0]], [0, 3], start=start))
    assert out.params.tolist() == pytest.approx([0.5, 0.5], abs=1e-12)
    assert out.weights.tolist() == pytest.approx([2 / 3, 1 / 3], abs=1e-7)  # shares of the step
    out = FedBuff(buffer_size=2, lr=0.5).aggregate(inputs([1.0, 1.0], [[2.0, 1.0], [5.0, 7.0]], [0, 3], start=start))
    assert out.params.tolist() == pytest.approx([1.25, 1.25], abs=1e-12)


def test_fedbuff_flsim_form_equals_flsims_aggregator_with_momentum():
    """FLSim's FedBuff: weights s(τ)/s(avg_staleness) with s polynomial (exponent 0.5), summed without dividing by K
    (WEIGHTED_SUM), delta = before - after, and torch SGD(lr, momentum) stepping on that sum, two server steps."""
    g = torch.Generator().manual_seed(1)
    rule = FedBuff(buffer_size=3, lr=0.7, optimizer="avgm", momentum=0.9, form="flsim", avg_staleness=1)
    w = torch.randn(4, dtype=torch.float64, generator=g)
    param = torch.nn.Parameter(w.clone())
    sgd = torch.optim.SGD([param], lr=0.7, momentum=0.9)  # create_optimizer_for_async_aggregator (lines 488-494)
    for staleness in ([0, 2, 5], [1, 1, 3]):
        before = torch.randn(3, 4, dtype=torch.float64, generator=g)
        after = before + torch.randn(3, 4, dtype=torch.float64, generator=g)
        out = rule.aggregate(RoundInputs.of(w, after, start_params=before, staleness=torch.tensor(staleness)))
        raw = [1 / (1 + t) ** 0.5 for t in staleness]  # PolynomialStalenessWeight._raw_weight (lines 102-105)
        weights = [r / (1 / (1 + 1) ** 0.5) for r in raw]  # normalised at avg_staleness = 1 (lines 39-42)
        total = sum(wt * (b - a) for wt, b, a in zip(weights, before, after))  # reducer: sum of weight * delta
        sgd.zero_grad()
        param.grad = total.clone()  # set_gradient(global, total_delta); _step_with_modified_lr(1.0)
        sgd.step()
        assert torch.allclose(out.params, param.detach(), rtol=0, atol=1e-12)
        w = out.params


def test_fedbuff_flsim_form_with_adam_is_flsims_torch_adam_not_reddis_fedadam():
    """FLSim's FedAdamFedBuffAggregator (facebookresearch/FLSim@7311f2d flsim/optimizers/async_aggregators.py:495-509:
    torch.optim.Adam(lr, weight_decay, betas=(beta1, beta2), eps); its config defaults :561-568: lr 0.001, weight_decay
    1e-5, betas (0.9, 0.999), eps 1e-8) stepping on the WEIGHTED_SUM of before - after (:421-426)."""
    # by hand, step 1: constant s = 1, sum of Δ = [1, -1]; gradient g = -[1, -1] + 1e-5 w; bias-corrected Adam's first
    # step is lr g / (|g| + eps): w = [1, 2] -> [1.1, 1.9] (Reddi's FedAdam on the same sum moves 0.099, not 0.1)
    rule = FedBuff(buffer_size=2, lr=0.1, optimizer="adam", form="flsim", staleness="constant", beta2=0.999)
    start = torch.tensor([[1.0, 2.0], [1.0, 2.0]], dtype=torch.float64)
    out = rule.aggregate(RoundInputs.of(torch.tensor([1.0, 2.0], dtype=torch.float64),
                                        torch.tensor([[1.5, 2.0], [1.5, 1.0]], dtype=torch.float64),
                                        start_params=start, staleness=torch.tensor([0, 0])))
    g = [-1 + 1e-5, 1 + 2e-5]
    assert out.params.tolist() == pytest.approx([1 - 0.1 * g[0] / (abs(g[0]) + 1e-8), 2 - 0.1 * g[1] / (abs(g[1]) + 1e-8)],
                                                abs=1e-14)
    assert out.params.tolist() == pytest.approx([1.1, 1.9], abs=1e-8)
    # three steps against torch.optim.Adam as FLSim builds it, with FLSim's staleness weights, then a resume
    gen = torch.Generator().manual_seed(3)
    rule = FedBuff(buffer_size=3, lr=0.01, optimizer="adam", form="flsim", beta1=0.9, beta2=0.999, eps=1e-8,
                   weight_decay=1e-5, avg_staleness=1)
    w = torch.randn(4, dtype=torch.float64, generator=gen) * 3
    param = torch.nn.Parameter(w.clone())
    adam = torch.optim.Adam([param], lr=0.01, weight_decay=1e-5, betas=(0.9, 0.999), eps=1e-8)
    for step, staleness in enumerate(([0, 2, 5], [1, 1, 3], [0, 4, 2])):
        if step == 2:  # a resumed rule continues the same optimizer
            state, rule = rule.state_dict(), FedBuff(buffer_size=3, lr=0.01, optimizer="adam", form="flsim", beta2=0.999)
            rule.load_state_dict(state)
        before = torch.randn(3, 4, dtype=torch.float64, generator=gen)
        after = before + torch.randn(3, 4, dtype=torch.float64, generator=gen)
        out = rule.aggregate(RoundInputs.of(w, after, start_params=before, staleness=torch.tensor(staleness)))
        weights = [(1 + t) ** -0.5 / 2 ** -0.5 for t in staleness]  # polynomial, normalised at avg_staleness 1
        adam.zero_grad()
        param.grad = sum(wt * (b - a) for wt, b, a in zip(weights, before, after))  # set_gradient(total_delta)
        adam.step()
        assert torch.allclose(out.params, param.detach(), rtol=0, atol=1e-12)
        w = out.params


@pytest.mark.parametrize("optimizer", ["yogi", "adagrad"])
def test_fedbuff_flsim_form_refuses_a_server_optimizer_flsim_does_not_have(optimizer):
    with pytest.raises(ValueError) as err:
        FedBuff(optimizer=optimizer, form="flsim")
    assert str(err.value) == (f"aggregator.optimizer='{optimizer}' is not allowed with aggregator.form=flsim; FLSim's "
                              "FedBuff servers are sgd, avgm, adam (form=paper has yogi and adagrad)")


def test_fedbuff_steps_a_fedopt_optimizer_on_the_buffered_mean():
    g = torch.Generator().manual_seed(2)
    w, start = torch.randn(6, generator=g), torch.randn(6, generator=g)
    buff, adam = FedBuff(buffer_size=4, optimizer="adam", lr=0.01), FedAdam(weighting="uniform", lr=0.01)
    for _ in range(2):
        x = torch.randn(4, 6, generator=g)
        ours = buff.aggregate(RoundInputs.of(w, x, start_params=start.expand(4, 6), staleness=torch.zeros(4, dtype=torch.long)))
        fedopt = adam.aggregate(RoundInputs.of(w, x, start_params=start))
        assert torch.allclose(ours.params, fedopt.params, rtol=1e-6, atol=1e-7)
        w = ours.params
    state = buff.state_dict()
    assert torch.equal(state["server"]["m"], adam.m) and state["server"]["steps"] == 2


# -- the driver --------------------------------------------------------------------------------------------------
def _summary(folder):
    return json.loads((folder / "summary.json").read_text())


@pytest.mark.parametrize("sync, fedbuff", [
    (["aggregator=fedavg", "aggregator.weighting=uniform"], ["aggregator=fedbuff"]),
    (["aggregator=fedadam", "aggregator.weighting=uniform"], ["aggregator=fedbuff", "aggregator.optimizer=adam",
                                                              "aggregator.lr=0.01"]),
], ids=["fedavg", "fedadam"])
def test_fedbuff_with_k_equal_to_c_equally_fast_clients_is_synchronous(sync, fedbuff, tmp_path):
    """K = C = N clients, all 1 s a step and the same number of steps: every wave arrives together, is one server
    step with staleness 0, and the next wave is sent the new model; so the run is synchronous FedAvg (or FedAdam)
    with uniform weights, round for round."""
    run_experiment([*DIGITS, "rounds=4", *sync], tmp_path / "sync")
    run_experiment([*DIGITS, "rounds=4", *fedbuff, "aggregator.buffer_size=10", "server=async",
                    "server.concurrency=10", *EQUAL_CLOCK], tmp_path / "async")
    a, s = rows(tmp_path / "async" / "weights.csv"), rows(tmp_path / "sync" / "weights.csv")
    assert len({r["local_steps"] for r in a}) == 1  # the premise: everyone equally fast
    assert [(r["round"], r["client"]) for r in a] == [(r["round"], r["client"]) for r in s]
    assert {r["staleness"] for r in a} == {"0"}
    ma, ms = rows(tmp_path / "async" / "metrics.csv"), rows(tmp_path / "sync" / "metrics.csv")
    for x, y in zip(ma, ms):
        for key in ("test_acc", "test_loss", "train_loss", "update_norm"):
            assert float(x[key]) == pytest.approx(float(y[key]), rel=1e-5, abs=1e-6), (key, x, y)
    steps = int(a[0]["local_steps"])
    assert [float(r["sim_time"]) for r in ma] == [steps * (r + 1.0) for r in range(4)]  # one wave per step
    assert [int(r["client_updates"]) for r in ma] == [10, 20, 30, 40]
    pa, ps = torch.load(tmp_path / "async" / "model.pt"), torch.load(tmp_path / "sync" / "model.pt")
    assert all(torch.allclose(pa[k], ps[k], rtol=1e-5, atol=1e-6) for k in pa)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_fedasync_with_one_client_in_flight_is_sequential_mixing_by_hand(alpha, tmp_path):
    """C = 1, constant s: each arrival started from the latest model (staleness 0), so the run is the sequence
    w <- (1 - α) w + α x_new(w) over the clients the dispatch stream picks; α = 1 is sequential SGD from client to
    client. Rebuilt here step by step with the engine's local training."""
    common = [*DIGITS, "rounds=5", "aggregator=fedasync", "aggregator.staleness=constant",
              f"aggregator.alpha={alpha}", "server=async", "server.concurrency=1", "clock=lognormal"]
    run_experiment(common, tmp_path / "run")
    with prepare(compose_config(*common), tmp_path / "fresh") as fresh:
        fed, loop = fresh.loop.fed, fresh.loop
        w, b = loop.params, loop.buffers
        counts, order = [0] * 10, []
        for v in range(5):
            client = int(torch.randperm(10, generator=generator(0, "dispatch", v))[0])  # every client idle
            counts[client] += 1
            order.append(client)
            job = RoundJob(fed.model, fed.trainer, fed.data, [fed.clients[client]], w, b, lr=0.05, seed=0,
                           round=v + 1, draws=[counts[client]])
            x = fed.engine.train_round(job)
            w = w * (1 - alpha) + x.params[0] * alpha
            b = x.buffers[0]
    got = rows(tmp_path / "run" / "weights.csv")
    assert [int(r["client"]) for r in got] == order and {r["staleness"] for r in got} == {"0"}
    model = torch.load(tmp_path / "run" / "model.pt")
    fed.model.load_state_dict(model)
    assert torch.allclose(get_params(fed.model), w, rtol=1e-6, atol=1e-7)


def test_sequential_and_parallel_engines_give_the_same_asynchronous_run(tmp_path):
    common = [*DIGITS, "rounds=6", "aggregator=fedbuff", "aggregator.buffer_size=2", "server=async",
              "server.concurrency=4", "clock=lognormal", "aggregator.optimizer=avgm"]
    run_experiment([*common, "engine=sequential"], tmp_path / "seq")
    run_experiment([*common, "engine=parallel"], tmp_path / "par")
    for name in ("metrics.csv", "weights.csv"):
        for x, y in zip(rows(tmp_path / "seq" / name), rows(tmp_path / "par" / name)):
            assert x.keys() == y.keys()
            for k in x:
                if k != "elapsed_s":
                    assert float(x[k]) == pytest.approx(float(y[k]), rel=1e-5, abs=1e-6), (name, k, x, y)
    stale = [int(r["staleness"]) for r in rows(tmp_path / "seq" / "weights.csv")]
    assert max(stale) > 0  # the case has stale arrivals


def test_flsims_max_staleness_drops_stale_arrivals_and_its_epoch_end_flushes_a_partial_buffer(tmp_path):
    """FLSim's trainer (facebookresearch/FLSim@7311f2d flsim/trainers/async_trainer.py:164-165): an arrival staler
    than max_staleness is not used; FedBuffAggregator.on_training_epoch_end (async_aggregators.py:406-419): after
    each epoch (every client once: N = 10 arrivals) a partly filled buffer makes a server step."""
    common = [*DIGITS, "rounds=8", "aggregator=fedbuff", "aggregator.buffer_size=3", "server=async",
              "server.concurrency=4", "clock=lognormal"]
    run_experiment(common, tmp_path / "all")
    assert max(int(r["staleness"]) for r in rows(tmp_path / "all" / "weights.csv")) > 0  # the case has stale ones
    assert [int(r["client_updates"]) for r in rows(tmp_path / "all" / "metrics.csv")] == [3 * r for r in range(1, 9)]
    run_experiment([*common, "aggregator.max_staleness=0"], tmp_path / "fresh")
    used, metrics = rows(tmp_path / "fresh" / "weights.csv"), rows(tmp_path / "fresh" / "metrics.csv")
    assert {r["staleness"] for r in used} == {"0"} and len(used) == 24  # 8 steps of 3 fresh arrivals
    assert sum(int(r["dropped_stale"]) for r in metrics) > 0  # the stale ones were dropped, not used
    each = int(rows(tmp_path / "all" / "metrics.csv")[0]["bits_up"]) // 3  # a dropped arrival was uploaded too
    assert [int(r["bits_up"]) for r in metrics] == [(3 + int(r["dropped_stale"])) * each for r in metrics]
    # flush: 3 + 3 + 3 arrivals, then the 10th alone ends the epoch; likewise from 11 to 20
    run_experiment([*common, "aggregator.flush_partial=true"], tmp_path / "flush")
    assert [int(r["client_updates"]) for r in rows(tmp_path / "flush" / "metrics.csv")] == [3, 6, 9, 10, 13, 16, 19, 20]


# -- refusals ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["server=async", "clock=lognormal"], "aggregator=fedavg is not allowed with server=async: it aggregates "
                                          "synchronous rounds; use aggregator=fedasync or aggregator=fedbuff"),
    (["aggregator=fedbuff"], "aggregator=fedbuff is not allowed with server=sync (the default): it is a rule of an "
                             "asynchronous server; add server=async and a clock"),
    (["aggregator=fedasync", "server=async"], "clock=none is not allowed with server=async: arrivals need simulated "
                                              "time; choose clock=lognormal"),
    (["aggregator=fedasync", "server=async", "clock=lognormal", "server.concurrency=11"],
     "server.concurrency=11 is not allowed with num_clients=10: at most the 10 clients"),
    (["aggregator=fedasync", "server=async", "clock=lognormal", "server.concurrency=0"],
     "server.concurrency=0 is not allowed; it must be an integer >= 1"),
    (["aggregator=fedasync", "server=async", "clock=lognormal", "clients_per_round=5"],
     "clients_per_round=5 is not allowed with server=async"),
    (["aggregator=fedbuff", "server=async", "clock=lognormal", "channel=topk"],
     "channel=topk is not allowed with server=async"),
    (["aggregator=fedbuff", "server=async", "clock=lognormal", "system=dropout"],
     "system=dropout is not allowed with server=async"),
    (["aggregator=fedbuff", "server=async", "clock=lognormal", "server.concurrency=5", "sampler=power_of_choice",
      "sampler.d=3"],  # all 5 in flight are sent at once at the start
     "sampler.d=3 is not allowed with server.concurrency=5: Power-of-Choice trains the 5 highest-loss of d "
     "candidates, so d must be at least server.concurrency (null: 2 x the clients sent at once)"),
    (["aggregator=fedbuff", "server=async", "clock=lognormal", "clock.deadline=5"],
     "clock.deadline=5 is not allowed with server=async"),
    (["aggregator=fedasync", "server=async", "clock=lognormal", "aggregator.alpha=1.5"],
     "aggregator.alpha=1.5 is not allowed; it must be a mixing weight in (0, 1]"),
    (["aggregator=fedbuff", "server=async", "clock=lognormal", "aggregator.buffer_size=0"],
     "aggregator.buffer_size=0 is not allowed; it must be an integer >= 1"),
    (["aggregator=fedbuff", "server=async", "clock=lognormal", "aggregator.optimizer=lamb"],
     "aggregator.optimizer='lamb' is not allowed; choose one of sgd, avgm, adam, yogi, adagrad"),
], ids=lambda v: v if isinstance(v, str) and "=" not in v else None)
def test_refused_in_one_line_before_training(overrides, message, tmp_path):
    with pytest.raises(SetupError) as err:
        run_experiment(["device=cpu", "rounds=2", *overrides], tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "metrics.csv").exists()


def test_train_refuses_without_the_command_line_too(tmp_path):
    with pytest.raises(Exception, match="aggregator=fedbuff is not allowed with server=sync"):
        train(compose_config("device=cpu", "aggregator=fedbuff"), tmp_path, {"aggregator": "fedbuff"})


def test_the_stacked_launcher_runs_an_asynchronous_job_alone_and_says_why():
    from hydra import compose, initialize_config_dir

    from conftest import CONF
    from hydra_plugins.fedagg_stacked_launcher.stacked_launcher import group_key

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["device=cpu", "engine=parallel", "server=async",
                                                       "aggregator=fedbuff", "clock=lognormal"], return_hydra_config=True)
        sync = compose(config_name="config", overrides=["device=cpu", "engine=parallel"], return_hydra_config=True)
    assert group_key(cfg) == (None, "server=async drives its own event queue on the simulated clock, whose server "
                                    "steps do not line up with other runs' rounds")
    assert group_key(sync)[0] is not None
