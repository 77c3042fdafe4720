"""engine=parallel against the reference: same seed, same client models to float32 tolerance.

Tiny data (3-4 clients of 7-40 samples, batches that leave partial last batches) through
an MLP, a CNN and a BatchNorm ResNet-20, two rounds each so that kept optimizer state
(and FedDyn's client state) carries over, with momentum, validation scores and the
CIFAR crop/flip path.
"""

from types import SimpleNamespace

import pytest
import torch

from fedagg.aggregators.feddyn import FedDynClient
from fedagg.aggregators.scaffold import ScaffoldClient
from fedagg.clients.batches import BatchPlan, num_steps
from fedagg.clients.client import ClientData
from fedagg.clients.objectives import FedProx
from fedagg.clients.trainer import LocalSGD
from fedagg.data.device import DeviceData
from fedagg.seeding import generator
from fedagg.engines.base import RoundJob
from fedagg.engines.parallel import ParallelEngine
from fedagg.engines.sequential import SequentialEngine
from fedagg.models.cnns import CNNSmall
from fedagg.models.flat import get_buffers, get_params
from fedagg.models.resnet_cifar import ResNet20
from fedagg.models.simple import MLP

TOL = 1e-4


def _setup(model_cls, channels, size, sizes, augment, val=2):
    g = torch.Generator().manual_seed(0)
    n = sum(sizes) + val * len(sizes)
    x = torch.randint(0, 256, (n, channels, size, size), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    bundle = SimpleNamespace(name="toy", num_classes=10, augment=augment, train_x=x, train_y=y, test_x=x, test_y=y,
                             mean=(0.5,) * channels, std=(0.25,) * channels)
    torch.manual_seed(0)
    model = model_cls(num_classes=10, in_channels=channels, image_size=size)
    data = DeviceData(bundle, torch.device("cpu"), model.input_shape)
    perm = torch.randperm(n, generator=g)
    clients, offset = [], 0
    for cid, k in enumerate(sizes):
        clients.append(ClientData(10 + cid, perm[offset: offset + k], perm[offset + k: offset + k + val]))
        offset += k + val
    return model, data, clients


def _two_rounds(engine, model, start, data, clients, trainer, lr):
    """Two rounds from the same global weights (the second sees kept optimizer and objective state)."""
    val = [c.val_idx for c in clients]
    return [engine.train_round(RoundJob(model, trainer, data, clients, start[0].clone(), start[1].clone(), lr=lr, seed=3,
                                        round=r, val_indices=val)) for r in (1, 2)]


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


CASES = {
    # model, channels, image size, client sizes, augment, trainer options, objective, engine options
    "mlp": (MLP, 1, 8, [7, 26, 13, 40], False,
            dict(lr=0.05, momentum=0.9, batch_size=6, local_epochs=2, weight_decay=1e-3),
            lambda: FedDynClient(alpha=0.1), dict(chunk_size=3)),
    "cnn": (CNNSmall, 1, 28, [9, 21, 14], True,
            dict(lr=0.05, momentum=0.9, nesterov=True, batch_size=8, local_epochs=2),
            lambda: FedProx(mu=0.1), dict()),
    # No batch of a single sample: BatchNorm on one 2x2 map makes even the reference chaotic
    # (a 1e-7 change of its input moves the trained weights by 1e-3), which no other kernels can match.
    "resnet20": (ResNet20, 3, 8, [7, 19, 12, 18], True,
                 dict(lr=0.02, momentum=0.9, batch_size=5, local_epochs=1), lambda: None, dict(chunk_size=2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_parallel_round_matches_sequential(case):
    model_cls, channels, size, sizes, augment, trainer_kw, objective, engine_kw = CASES[case]
    model, data, clients = _setup(model_cls, channels, size, sizes, augment)
    ref_trainer = LocalSGD(**trainer_kw, keep_optimizer_state=True, objective=objective())
    par_trainer = LocalSGD(**trainer_kw, keep_optimizer_state=True, objective=objective())
    start = get_params(model), get_buffers(model)  # the engines leave trained weights in `model`
    ref = _two_rounds(SequentialEngine(), model, start, data, clients, ref_trainer, trainer_kw["lr"])
    par = _two_rounds(ParallelEngine(**engine_kw), model, start, data, clients, par_trainer, trainer_kw["lr"])
    for r, (s, p) in enumerate(zip(ref, par), start=1):
        for k in range(len(clients)):
            assert _rel(p.params[k], s.params[k]) < TOL, f"round {r}, client {k}: parameters"
            if s.buffers.numel():
                assert _rel(p.buffers[k], s.buffers[k]) < TOL, f"round {r}, client {k}: buffers"
        torch.testing.assert_close(p.train_loss, s.train_loss, rtol=TOL, atol=TOL)
        torch.testing.assert_close(p.val_acc, s.val_acc)
    for cid in (c.id for c in clients):  # the state each engine leaves behind is interchangeable
        a, b = par_trainer.optimizer_states[cid], ref_trainer.optimizer_states[cid]
        assert a.shape == b.shape == start[0].shape  # every parameter's momentum, flat
        assert _rel(a, b) < 10 * TOL  # sums of gradients, which are more sensitive than the weights
    if isinstance(ref_trainer.objective, FedDynClient):
        for cid in (c.id for c in clients):
            assert _rel(par_trainer.objective.grad_state[cid], ref_trainer.objective.grad_state[cid]) < TOL


def test_batch_plan_serves_each_client_the_batches_it_draws_alone():
    _, data, clients = _setup(CNNSmall, 1, 28, [9, 21, 14], True)
    batch_size, epochs = 4, 2
    ordered = sorted(clients, key=lambda c: -num_steps(c.num_samples, batch_size, epochs))
    plan = BatchPlan(ordered, data, batch_size=batch_size, epochs=epochs, seed=1, round=5)
    for k, client in enumerate(ordered):
        g = generator(1, "batches", client.id, 5, device=data.device)
        t = 0
        for _ in range(epochs):
            order = client.train_idx[torch.randperm(client.num_samples, generator=g)]
            for batch in order.split(batch_size):
                x, y = data.train_batch(batch, g)
                (n, sel), = [(n, sel) for n, sel in plan.groups[t] if k in torch.arange(len(ordered))[sel]]
                row = int((torch.arange(len(ordered))[sel] == k).nonzero())
                px, py = plan.batch(t, n, sel)
                assert n == len(batch) and torch.equal(px.view(-1, n, *x.shape[1:])[row], x)
                assert torch.equal(py.view(-1, n)[row], y)
                t += 1
        assert plan.steps[k] == t and all(k not in torch.arange(len(ordered))[sel]
                                          for step in plan.groups[t:] for _, sel in step)


def test_padded_batch_fills_a_partial_batch_with_the_clients_own_first_sample():
    _, data, clients = _setup(MLP, 1, 8, [7, 13], False)
    ordered = [clients[1], clients[0]]  # 13 samples: 3 steps of 6; 7 samples: 2 steps
    plan = BatchPlan(ordered, data, batch_size=6, epochs=1, seed=2, round=1)
    assert plan.active == [2, 2, 1]
    x, y, real = plan.padded_batch(1)
    assert real.tolist() == [6, 1] and x.shape[0] == y.shape[0] == 12
    assert torch.equal(x[:6], plan.batch(1, 6, slice(0, 1))[0]) and torch.equal(x[6:7], plan.batch(1, 1, slice(1, 2))[0])
    first = plan.batch(0, 6, slice(1, 2))[0][0]  # the second client's first sample of the round
    assert all(torch.equal(row, first) for row in x[7:])
    x, y, real = plan.padded_batch(2)
    assert real.tolist() == [1] and torch.equal(x[:1], plan.batch(2, 1, slice(0, 1))[0])
    assert all(torch.equal(row, plan.batch(0, 6, slice(0, 1))[0][0]) for row in x[1:])


def test_runs_on_one_dataset_share_its_tensors_and_their_batches_come_from_one_gather():
    """Two runs' datas built from equal images share one tensor (a stacked sweep keeps one copy); a run whose
    labels an attack changed keeps its own labels. Their plans' batches gathered together equal each plan's own
    batch, inputs (with each plan's own crops and flips) and labels alike."""
    from fedagg.clients.batches import gather
    from fedagg.data.device import inputs_key, labels_key

    _, data, clients = _setup(CNNSmall, 1, 16, [9, 5], True)
    _, twin, twin_clients = _setup(CNNSmall, 1, 16, [9, 5], True)  # equal tensors, made again
    assert twin.train_x is data.train_x and inputs_key(twin) == inputs_key(data)
    twin.train_y = (9 - twin.train_y).contiguous()  # as attack=label_flip replaces a run's labels
    assert labels_key(twin) != labels_key(data)
    ordered = [clients[0], clients[1]]
    plans = [BatchPlan(ordered, data, batch_size=4, epochs=1, seed=1, round=2),
             BatchPlan([twin_clients[1]], twin, batch_size=4, epochs=1, seed=7, round=2)]
    picks = [(plans[0], plans[0].picks(0, 4, slice(0, 2))), (plans[1], plans[1].picks(0, 4, slice(0, 1)))]
    x, y = gather(picks)
    own = [plan.batch(0, 4, sel) for plan, sel in ((plans[0], slice(0, 2)), (plans[1], slice(0, 1)))]
    assert x.shape[0] == 12 and torch.equal(x, torch.cat([o[0] for o in own])) and torch.equal(y, torch.cat([o[1] for o in own]))
    assert torch.equal(y[8:], 9 - data.train_y[plans[1].order[picks[1][1]]])  # the twin's flipped labels
    other = DeviceData(SimpleNamespace(name="toy", num_classes=10, augment=True, train_x=data.train_x.clone() + 1,
                                       train_y=data.train_y, test_x=data.test_x, test_y=data.test_y, mean=(0.5,),
                                       std=(0.25,)), torch.device("cpu"), (1, 16, 16))
    assert other.train_x is not data.train_x and other.train_y is data.train_y and inputs_key(other) != inputs_key(data)


def test_stacked_task_losses_count_only_the_real_samples():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(2, 3, 4, generator=g), torch.randint(0, 4, (2, 3), generator=g)
    logits[1, 1:] = 1e30  # the filling: whatever it holds, it must not count
    got = LocalSGD().stacked_task_losses(logits, y, torch.tensor([3, 1]))
    want = torch.stack([torch.nn.functional.cross_entropy(logits[0], y[0]),
                        torch.nn.functional.cross_entropy(logits[1, :1], y[1, :1])])
    assert torch.allclose(got, want, rtol=1e-6)
    # one prediction per position: the mean over the real samples' positions
    logits, y = torch.randn(2, 3, 5, 4, generator=g), torch.randint(0, 4, (2, 3, 5), generator=g)
    got = LocalSGD().stacked_task_losses(logits, y, torch.tensor([2, 3]))
    want = [torch.nn.functional.cross_entropy(logits[k, :n].reshape(-1, 4), y[k, :n].reshape(-1)) for k, n in ((0, 2), (1, 3))]
    assert torch.allclose(got, torch.stack(want), rtol=1e-6)
    assert torch.allclose(LocalSGD().stacked_task_losses(logits, y), torch.stack(
        [torch.nn.functional.cross_entropy(logits[k].reshape(-1, 4), y[k].reshape(-1)) for k in (0, 1)]), rtol=1e-6)


@pytest.mark.parametrize("model_cls,channels,size,calls", [
    (MLP, 1, 8, 5),  # no BatchNorm: one call a step, partial batches filled up (the largest client's 5 steps)
    (ResNet20, 3, 8, 7),  # BatchNorm: a call per batch size a step (last batches of 1, 1 and 2 samples apart)
])
def test_a_step_is_one_call_unless_batchnorm_couples_the_batch(model_cls, channels, size, calls, monkeypatch):
    model, data, clients = _setup(model_cls, channels, size, [7, 26, 13], False)
    engine, seen = ParallelEngine(), []
    real_step = ParallelEngine._step
    monkeypatch.setattr(ParallelEngine, "_step", lambda self, *a: seen.append(a[2]) or real_step(self, *a))
    engine.train_round(RoundJob(model, LocalSGD(lr=0.05, batch_size=6, local_epochs=1), data, clients, get_params(model),
                                get_buffers(model), lr=0.05, seed=0, round=1))
    assert len(seen) == calls and set(seen) == ({6} if model_cls is MLP else {6, 1, 2})


def test_chunking_and_channels_last_leave_results_unchanged():
    model, data, clients = _setup(CNNSmall, 1, 28, [9, 21, 14], True)
    trainer = dict(lr=0.05, momentum=0.5, batch_size=8)
    gp, gb = get_params(model), get_buffers(model)
    outs = [ParallelEngine(**kw).train_round(RoundJob(model, LocalSGD(**trainer), data, clients, gp, gb, lr=0.05, seed=0,
                                                      round=1))
            for kw in (dict(), dict(chunk_size=1), dict(channels_last=True))]
    for out in outs[1:]:
        assert _rel(out.params, outs[0].params) < TOL
        torch.testing.assert_close(out.train_loss, outs[0].train_loss, rtol=TOL, atol=TOL)


def test_bf16_autocast_stays_close_to_fp32():
    model, data, clients = _setup(CNNSmall, 1, 28, [9, 21], False)
    gp, gb = get_params(model), get_buffers(model)
    outs = [ParallelEngine(precision=p).train_round(RoundJob(model, LocalSGD(lr=0.05, batch_size=8), data, clients, gp, gb,
                                                             lr=0.05, seed=0, round=1)) for p in ("fp32", "bf16")]
    assert outs[1].params.dtype == torch.float32
    assert _rel(outs[1].params - gp, outs[0].params - gp) < 0.1  # the update, to bf16's precision


@pytest.mark.slow
def test_compiled_engine_matches_eager():
    model, data, clients = _setup(CNNSmall, 1, 28, [9, 21, 14], True)
    gp, gb = get_params(model), get_buffers(model)
    outs = [ParallelEngine(compile=c).train_round(RoundJob(model, LocalSGD(lr=0.05, batch_size=8), data, clients, gp, gb,
                                                           lr=0.05, seed=0, round=1)) for c in (False, True)]
    assert _rel(outs[1].params, outs[0].params) < TOL


@pytest.mark.parametrize("kwargs, key", [({"chunk_size": 0}, "engine.chunk_size=0"),
                                         ({"precision": "fp16"}, "engine.precision='fp16'"),
                                         ({"eval_batch_size": 0}, "engine.eval_batch_size=0")])
def test_bad_options_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        ParallelEngine(**kwargs)


def test_budgets_cut_each_clients_plan_short_and_both_engines_agree():
    """Stragglers: a client with a budget of b steps trains on the first b batches of its usual plan."""
    model, data, clients = _setup(CNNSmall, 1, 28, [9, 21, 14, 18], True)
    trainer = dict(lr=0.05, momentum=0.9, batch_size=4, local_epochs=2)
    full = [num_steps(c.num_samples, 4, 2) for c in clients]  # 6, 12, 8, 10
    budgets = [2, 40, 1, 7]  # 40 is more than client 1 has: it takes its 12
    steps = [min(f, b) for f, b in zip(full, budgets)]
    for client, budget, step in zip(clients, budgets, steps):  # a prefix of the client's full plan
        whole = BatchPlan([client], data, batch_size=4, epochs=2, seed=3, round=1)
        cut = BatchPlan([client], data, batch_size=4, epochs=2, seed=3, round=1, budgets=[budget])
        assert cut.steps == [step] and len(cut) == step and cut.seen == [sum(n for (n, _), in whole.groups[:step])]
        for t in range(step):
            (n, one), = cut.groups[t]
            assert torch.equal(cut.batch(t, n, one)[0], whole.batch(t, *whole.groups[t][0])[0])
    gp, gb = get_params(model), get_buffers(model)
    outs = [engine.train_round(RoundJob(model, LocalSGD(**trainer), data, clients, gp, gb, lr=0.05, seed=3, round=1,
                                        budgets=budgets)) for engine in (SequentialEngine(), ParallelEngine())]
    for out in outs:
        assert out.local_steps.tolist() == steps
    for k in range(4):
        assert _rel(outs[1].params[k], outs[0].params[k]) < TOL
    torch.testing.assert_close(outs[1].train_loss, outs[0].train_loss, rtol=TOL, atol=TOL)
    unbudgeted = SequentialEngine().train_round(RoundJob(model, LocalSGD(**trainer), data, clients, gp, gb, lr=0.05,
                                                         seed=3, round=1))
    assert torch.equal(unbudgeted.params[1], outs[0].params[1])  # a budget above the full plan changes nothing
    assert not torch.equal(unbudgeted.params[0], outs[0].params[0])


def test_scaffold_client_half_runs_alike_in_both_engines():
    """SCAFFOLD's correction, variates and payloads, over two rounds (the second with the variates of the first)."""
    model, data, clients = _setup(MLP, 1, 8, [7, 26, 13, 40], False)
    start = get_params(model), get_buffers(model)
    c = 0.05 * torch.randn(start[0].numel(), generator=torch.Generator().manual_seed(1))
    trainers, rounds = [], []
    for engine in (SequentialEngine(), ParallelEngine(chunk_size=3)):
        half = ScaffoldClient()
        half.c = c.clone()  # a server variate as after a few rounds: the correction is not zero
        trainers.append(LocalSGD(lr=0.05, momentum=0.9, batch_size=6, local_epochs=2, objective=half))
        rounds.append(_two_rounds(engine, model, start, data, clients, trainers[-1], 0.05))
    for s, p in zip(*rounds):
        for k in range(len(clients)):
            assert _rel(p.params[k], s.params[k]) < TOL
            assert _rel(p.payloads["delta_c"][k], s.payloads["delta_c"][k]) < TOL
    ref, par = (t.objective.variates for t in trainers)
    assert ref.keys() == par.keys() == {c.id for c in clients}
    assert all(_rel(par[i], ref[i]) < TOL for i in ref)


def test_channels_last_weights_reach_the_grouped_convolution_without_a_copy():
    from fedagg.engines._packed import stacked_channels_last

    w = torch.randn(4, 8, 3, 5, 5)
    stacked = stacked_channels_last(w)
    assert torch.equal(stacked, w)
    leaf = stacked[1:3].detach().requires_grad_()  # a chunk's group of clients, as the engine slices it
    packed = leaf.reshape(-1, 3, 5, 5)  # what _conv_packed hands F.conv2d
    assert packed.data_ptr() == leaf.data_ptr() and packed.is_contiguous(memory_format=torch.channels_last)
    assert packed.contiguous(memory_format=torch.channels_last).data_ptr() == leaf.data_ptr()
    plain = w[1:3].detach()  # stacked as before: every forward copied the weights into channels_last
    assert plain.reshape(-1, 3, 5, 5).contiguous(memory_format=torch.channels_last).data_ptr() != plain.data_ptr()


def test_grouped_convolutions_on_the_cpu_compute_in_channels_last(monkeypatch):
    """Faster there (docs/explanations/speed.md), whatever engine.channels_last says; not in a model with
    normalisation layers (not measured faster)."""
    from fedagg.engines import _packed
    from fedagg.models.cnns import CNNBN

    assert not _packed.pack(CNNBN(num_classes=10, in_channels=1, image_size=28))[1].cpu_channels_last

    model, data, clients = _setup(CNNSmall, 1, 28, [9, 21, 14], False)
    seen, conv2d = [], _packed.F.conv2d
    monkeypatch.setattr(_packed.F, "conv2d", lambda x, w, *a: seen.append((x, w, a[-1])) or conv2d(x, w, *a))
    ParallelEngine().train_round(RoundJob(model, LocalSGD(lr=0.05, batch_size=8), data, clients, get_params(model),
                                          get_buffers(model), lr=0.05, seed=0, round=1))
    grouped = [(x, w) for x, w, groups in seen if groups == 3]  # the step's three clients in one call
    assert len(grouped) >= 2 and all(x.dim() == 4 for x, _ in grouped)
    cl = torch.channels_last
    assert all(x.is_contiguous(memory_format=cl) and w.is_contiguous(memory_format=cl) for x, w in grouped)
