"""Low-rank adapters (adapter=lora): the model side, and each rule against hand computations and its authors' code.

Transcriptions of released code (torch on the same tensors, as the code computes them):
- FedIT, JayZhang42/FederatedGPT-Shepherd@90d8aa6:fed_utils/model_aggregation.py:10-27: every adapter tensor is
  the sum of the clients' tensors times n_k / Σ n_j.
- FLoRA, ATP-1010/FederatedLLM@7bea158:fed_utils/model_aggregation.py:77-91: lora_A [r, k] tensors scaled by p_k
  and concatenated along dim 0, lora_B [d, r] concatenated along dim 1 unscaled (the paper scales B instead:
  the product is the same); main.py:390-391 merges the stacked adapter into the base.
- FedEx-LoRA, RaghavSinghal10/fedex-lora@683a3f3:fed_agg.py:86-114: M = mean_k B_k A_k, residue = M − mean B mean A,
  base += scaling · residue (uniform means: `weighting=uniform`; the paper's p_k = n_k / n is the default).
- FedSA-LoRA, Pengxin-Guo/FedSA-LoRA@fc276b5:federatedscope/llm/yamls/fedsa-lora.yaml:16 lists lora_B as a
  `local_param`: never averaged into a client's model, which keeps its own.
FFA-LoRA, FlexLoRA and HetLoRA are checked against the papers' equations (no released code was read).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedagg.aggregators.adapter_rules import factor_mask
from fedagg.aggregators.fedex_lora import FedExLoRA
from fedagg.aggregators.fedit import FedIT
from fedagg.aggregators.flexlora import FlexLoRA
from fedagg.aggregators.flora import FLoRA
from fedagg.aggregators.hetlora import HetLoRA
from fedagg.aggregators.inputs import RoundInputs
from fedagg.engines._packed import pack
from fedagg.models.adapters import LoRA
from fedagg.models.adapters.layout import aggregation_error
from fedagg.models.cnns import CNNSmall
from fedagg.models.flat import ParamLayout, get_params
from fedagg.models.simple import MLP


class Two(nn.Module):
    """Linear(3 -> 4) -> ReLU -> Linear(4 -> 2), with a BatchNorm to check that buffers stay buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        return self.net(x)


def adapted(ranks=(2, 2, 2), rank=2, alpha=4.0, frozen_a=False, seed=0):
    torch.manual_seed(seed)
    model = Two()
    held = LoRA(rank=rank, alpha=alpha, ranks=list(ranks)).apply(model, len(ranks), seed, frozen_a)
    return model, held


def inputs_for(model, held, clients, num_samples, ids=None, global_params=None):
    layout = replace(ParamLayout.of(model), adapters=held.layout)
    k = clients.shape[0]
    ids = torch.arange(k) if ids is None else ids
    return RoundInputs(global_params=get_params(model) if global_params is None else global_params,
                       client_params=clients, num_samples=torch.tensor(num_samples), client_ids=ids, round=1,
                       layout=layout, all_num_samples=torch.tensor(num_samples),
                       base=held.base.vector() if held.layout.pairs[0].a is None else None)  # as the round gives it


def client_factors(held, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    clients = torch.randn(k, held.layout.num_params, generator=g)
    masks = [held.layout.rank_mask(r) for r in held.layout.ranks_of(torch.arange(k))]
    return torch.where(torch.stack(masks), clients, torch.zeros(()))  # zero-padded past each client's rank


def effective_weights(model, held, params):
    """Each adapted layer's weight W0 + s B A with the base as it is now and adapters `params`."""
    lay = held.layout
    base = held.base.vector()
    return [base[p.base].view(p.d, p.k) + lay.scale * lay.products(params, p, base) for p in lay.pairs]


# -- the model side ---------------------------------------------------------------------------------------------

def test_only_the_adapters_train_and_the_adapted_model_starts_as_the_base():
    torch.manual_seed(0)
    model = Two().eval()
    x = torch.randn(5, 3)
    before = model(x)
    buffers = [n for n, _ in model.named_buffers()]
    held = LoRA(rank=2, alpha=4.0).apply(model, 3, 0)
    assert [n.rsplit(".", 1)[1] for n, _ in model.named_parameters()] == ["A", "B", "A", "B"]
    assert [n for n, _ in model.named_buffers()] == buffers  # BatchNorm statistics stay buffers; the base is neither
    assert held.layout.num_params == 2 * (3 + 4) + 2 * (4 + 2)  # r (d + k) per layer
    assert held.base.numel == 4 * 3 + 4 + 4 + 4 + 2 * 4 + 2  # weights, biases, BatchNorm's affine
    assert torch.equal(model(x), before)  # B = 0 at start
    assert "26 trainable of 60 parameters (43.33%); base Two frozen (34 values" in held.line


def test_delta_w_is_alpha_over_r_times_b_a_on_linear_and_conv():
    torch.manual_seed(0)
    model = CNNSmall(num_classes=10, in_channels=1, image_size=28).eval()
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    w0, bias = conv.weight.detach().clone(), conv.bias.detach().clone()
    held = LoRA(rank=3, alpha=6.0).apply(model, 2, 0)
    low = conv.parametrizations.weight[0]
    with torch.no_grad():
        low.B.copy_(torch.arange(low.B.numel(), dtype=torch.float32).view_as(low.B) / 100)
    x = torch.randn(2, 1, 28, 28)
    want = F.conv2d(x, w0 + 2.0 * (low.B @ low.A).view_as(w0), bias, conv.stride, conv.padding)  # α / r = 2
    torch.testing.assert_close(conv(x), want)
    assert all(isinstance(m, (nn.Linear, nn.Conv2d)) for m in model.modules()
               if hasattr(m, "parametrizations"))
    assert len(held.layout.pairs) == sum(isinstance(m, (nn.Linear, nn.Conv2d)) for m in model.modules())


def test_the_base_is_held_once_and_the_packed_copy_sees_its_changes():
    model, held = adapted()
    packed, _ = pack(model)
    ours = {id(t) for t in held.base.tensors()}
    theirs = {id(v) for m in packed.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)}
    assert ours <= theirs  # the same tensors, not copies
    x = torch.randn(4, 3)
    delta = torch.zeros(held.base.numel)
    delta[held.layout.pairs[0].base] = 1.0
    held.base.add_(delta)
    model.eval(), packed.eval()
    torch.testing.assert_close(packed(x), model(x), rtol=0, atol=0)


def test_unequal_ranks_pad_to_the_largest_and_a_client_trains_only_its_own(tmp_path):
    from fedagg.clients.trainer import LocalSGD
    from fedagg.engines.base import RoundJob
    from fedagg.engines.parallel import ParallelEngine
    from fedagg.engines.sequential import SequentialEngine
    from fedagg.models.adapters.masks import RankMasks
    from tests.test_parallel_engine import _rel, _setup

    model, data, clients = _setup(MLP, 1, 8, [9, 14, 11], augment=False)
    held = LoRA(rank=2, ranks=[3] * 10 + [1, 3, 2]).apply(model, 13, 0)  # the clients are ids 10, 11, 12
    lay = held.layout
    assert lay.rank == 3 and lay.client_ranks[10:] == (1, 3, 2)
    start = get_params(model) + 0.01  # B non-zero too: every factor entry gets a gradient unless cut
    results = []
    for engine in (SequentialEngine(), ParallelEngine(chunk_size=2)):
        trainer = LocalSGD(lr=0.1, momentum=0.9, batch_size=4, local_epochs=2)
        trainer.rank_masks = RankMasks.of(lay, torch.device("cpu"))
        results.append(engine.train_round(RoundJob(model, trainer, data, clients, start.clone(), torch.zeros(0),
                                                   lr=0.1, seed=3, round=1)))
    for row, rank in zip(results[0].params, (1, 3, 2)):
        mask = lay.rank_mask(rank)
        assert bool((row[~mask] == 0).all())  # exactly zero past the client's rank
        assert bool((row[mask] != start[mask]).all())  # and trained within it
    assert _rel(results[1].params, results[0].params) < 1e-4  # the engines agree


# -- the rules --------------------------------------------------------------------------------------------------

def test_aggregation_error_by_hand():
    model, held = adapted(ranks=(1, 1), rank=1)
    lay = held.layout
    first = lay.pairs[0]  # B [4, 1], A [1, 3]
    clients = torch.zeros(2, lay.num_params)
    clients[0, first.b], clients[0, first.a] = torch.tensor([1.0, 0, 0, 0]), torch.tensor([1.0, 0, 0])
    clients[1, first.b], clients[1, first.a] = torch.tensor([0, 1.0, 0, 0]), torch.tensor([0, 1.0, 0])
    # Σ p B A = diag(.5, .5); (Σ p B)(Σ p A) = .25 on the top-left 2x2: ‖[[.25, -.25], [-.25, .25]]‖ = .5
    assert aggregation_error(lay, clients, torch.tensor([0.5, 0.5]), held.base.vector()) == pytest.approx(
        0.5 / math.sqrt(0.5), rel=1e-6)


def test_fedit_is_the_authors_weighted_sum_of_the_adapter_tensors():
    model, held = adapted(ranks=(2, 1, 2))
    clients = client_factors(held, 3)
    n = [10, 30, 20]
    out = FedIT().aggregate(inputs_for(model, held, clients, n))
    weights = F.normalize(torch.tensor(n, dtype=torch.float32), p=1, dim=0)  # model_aggregation.py:10-13
    summed = sum(clients[k] * weights[k] for k in range(3))  # l. 19-24, on every tensor alike
    torch.testing.assert_close(out.params, summed, rtol=1e-6, atol=1e-6)
    assert out.base_update is None and out.metrics["error"] > 0.01  # inexact
    lay = held.layout
    assert out.metrics["bits_up"] == 32 * sum(r * (p.d + p.k) for r in (2, 1, 2) for p in lay.pairs)


@pytest.mark.parametrize("rule", [FLoRA, FedExLoRA])
def test_one_round_of_an_exact_rule_is_the_average_of_the_clients_full_models(rule):
    model, held = adapted(ranks=(2, 1, 2))
    lay = held.layout
    before = get_params(model) + 0.05  # a global model with non-zero adapters
    clients = client_factors(held, 3)
    n = [10, 30, 20]
    p = torch.tensor(n, dtype=torch.float32) / 60
    wanted = [sum(p[k] * (held.base.vector()[pair.base].view(pair.d, pair.k)
                          + lay.scale * lay.products(clients[k], pair)) for k in range(3)) for pair in lay.pairs]
    out = rule().aggregate(inputs_for(model, held, clients, n, global_params=before))
    held.base.add_(out.base_update)  # what the round does with it
    for got, want in zip(effective_weights(model, held, out.params), wanted):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert out.metrics["error"] > 0.01  # FedIT's average of the same factors would not be exact


def test_flora_is_the_authors_stacking_and_starts_fresh_adapters():
    model, held = adapted(ranks=(2, 1, 2))
    lay = held.layout
    clients = client_factors(held, 3)
    n = [10, 30, 20]
    out = FLoRA().aggregate(inputs_for(model, held, clients, n))
    weights = F.normalize(torch.tensor(n, dtype=torch.float32), p=1, dim=0)
    ranks = (2, 1, 2)
    for pair in lay.pairs:
        a_stack = torch.cat([lay.a(clients[k], pair)[:ranks[k]] * weights[k] for k in range(3)], dim=0)  # l. 77-82
        b_stack = torch.cat([lay.b(clients[k], pair)[:, :ranks[k]] for k in range(3)], dim=1)  # l. 87-91
        merged = lay.scale * b_stack @ a_stack  # merge_and_unload, main.py:391
        torch.testing.assert_close(out.base_update[pair.base].view(pair.d, pair.k), merged, rtol=1e-5, atol=1e-6)
        assert bool((out.params[pair.b] == 0).all())  # fresh adapters: B = 0 ...
        assert not torch.equal(out.params[pair.a], get_params(model)[pair.a])  # ... and A drawn anew
    assert out.metrics["bits_down"] == 3 * 32 * sum(r * (p.d + p.k) for r in ranks for p in lay.pairs)


def test_fedex_lora_is_the_authors_residual_with_uniform_weights():
    model, held = adapted()
    lay = held.layout
    clients = client_factors(held, 3)
    out = FedExLoRA(weighting="uniform").aggregate(inputs_for(model, held, clients, [10, 30, 20]))
    for pair in lay.pairs:
        a, b = lay.a(clients, pair), lay.b(clients, pair)
        m = sum(b[i] @ a[i] for i in range(3)) / 3  # fed_agg.py:96-98
        residue = m - b.mean(0) @ a.mean(0)  # l. 108
        torch.testing.assert_close(out.base_update[pair.base].view(pair.d, pair.k), residue * lay.scale,
                                   rtol=1e-5, atol=1e-6)  # l. 112-114 (no transpose: nn.Linear's [d, k])
        torch.testing.assert_close(lay.a(out.params, pair), a.mean(0))


def test_flexlora_gives_each_rank_the_truncated_svd():
    model, held = adapted(ranks=(3, 1, 2), rank=3)
    lay = held.layout
    clients = client_factors(held, 3)
    n = [10, 30, 20]
    out = FlexLoRA().aggregate(inputs_for(model, held, clients, n))
    p = torch.tensor(n, dtype=torch.float32) / 60
    for pair in lay.pairs:
        full = sum(p[k] * lay.products(clients[k], pair) for k in range(3))
        u, s, vh = torch.linalg.svd(full, full_matrices=False)
        for r in (1, 2, 3):  # what a client of rank r starts from: the first r of the global factors
            got = lay.b(out.params, pair)[:, :r] @ lay.a(out.params, pair)[:r]
            torch.testing.assert_close(got, u[:, :r] @ torch.diag(s[:r]) @ vh[:r], rtol=1e-4, atol=1e-5)
        if torch.linalg.matrix_rank(full) <= 3:
            torch.testing.assert_close(lay.products(out.params, pair), full, rtol=1e-4, atol=1e-5)


def test_hetlora_weights_by_norm_and_prunes_a_rank_whose_tail_shrinks():
    model, held = adapted(ranks=(3, 3), rank=3)
    lay = held.layout
    clients = client_factors(held, 2)
    rule = HetLoRA(decay=0.5)
    rule.client.setup(model)
    inputs = inputs_for(model, held, clients, [10, 10])
    norms = torch.stack([sum((lay.products(clients[k], pair) ** 2).sum() for pair in lay.pairs).sqrt()
                         for k in range(2)])
    torch.testing.assert_close(rule.client_weights(inputs), norms / norms.sum())
    out = rule.aggregate(inputs)
    torch.testing.assert_close(out.params, out.weights @ clients)
    assert rule.client.ranks == {} and out.metrics["mean_rank"] == 3  # first measurement: nothing to compare with
    shrunk = clients.clone()
    for pair in lay.pairs:  # client 0's tail past floor(0.5 * 3) = 1 is halved; client 1's doubled
        shrunk[0, pair.b] = (lay.b(clients[0], pair) * torch.tensor([1.0, 0.5, 0.5])).reshape(-1)
        shrunk[1, pair.b] = (lay.b(clients[1], pair) * torch.tensor([1.0, 2.0, 2.0])).reshape(-1)
    out = rule.aggregate(inputs_for(model, held, shrunk, [10, 10]))
    assert rule.client.ranks == {0: 1} and out.metrics["mean_rank"] == 2
    start, _ = rule.client.start(0, torch.ones(lay.num_params), torch.zeros(0))
    assert torch.equal(start, lay.rank_mask(1).float())  # it now starts from rank 1


def test_ffa_lora_keeps_a_out_of_the_flat_vector_and_is_exact():
    from fedagg.aggregators.ffa_lora import FFALoRA

    model, held = adapted(frozen_a=True)
    lay = held.layout
    assert lay.num_params == sum(p.d * lay.rank for p in lay.pairs)  # B alone
    assert torch.equal(factor_mask(model, "B"), torch.ones(lay.num_params, dtype=torch.bool))
    clients = client_factors(held, 3)
    out = FFALoRA().aggregate(inputs_for(model, held, clients, [10, 30, 20]))
    assert out.metrics["error"] < 1e-6  # Σ p B_k A = (Σ p B_k) A
    assert out.metrics["bits_up"] == 32 * sum(2 * p.d for p in lay.pairs) * 3


def test_fedsa_lora_clients_start_from_their_own_b():
    from fedagg.aggregators.fedsa_lora import FedSALoRA
    from fedagg.clients.objectives import LocalWork

    model, held = adapted()
    rule = FedSALoRA()
    rule.client.setup(model)
    b = factor_mask(model, "B")
    trained = get_params(model) + 1.0
    rule.client.after_training(4, trained, get_params(model), LocalWork(1, 0.1))
    glob = get_params(model) + 2.0
    own, _ = rule.client.start(4, glob, torch.zeros(0))
    never, _ = rule.client.start(5, glob, torch.zeros(0))
    assert torch.equal(own[b], trained[b]) and torch.equal(own[~b], glob[~b])
    assert bool((never[b] == 0).all())  # the initial B


def test_a_tied_weight_is_frozen_once_in_every_module_that_shares_it():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight  # a language model's tied input and output embedding

        def forward(self, x):
            return self.head(self.embed(x))

    torch.manual_seed(0)
    model = Tied()
    x = torch.tensor([[0, 3, 4]])
    before = model(x)
    held = LoRA(rank=1).apply(model, 2, 0)
    assert [n.rsplit(".", 1)[1] for n, _ in model.named_parameters()] == ["A", "B"]  # nothing of the base trains
    assert held.base.numel == 15 and model.embed.weight is model.head.parametrizations.weight.original
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)
    assert set(held.model_state(model)) == {"embed.weight", "head.weight"}
