"""The validation batches every engine scores clients in, and FedLAW's server batches: values as specified,
drawn without a host copy per batch or epoch."""

import pytest
import torch

from fedagg.aggregators.fedlaw import FedLAW
from fedagg.clients.validation import ValidationPlan


def test_plan_pads_each_client_with_its_last_index_and_marks_the_padding():
    vals = [torch.tensor([7, 8, 9]), torch.tensor([], dtype=torch.long), torch.tensor([1, 2, 3, 4, 5])]
    plan = ValidationPlan(vals, batch_size=6)  # 6 // 3 clients = 2 samples a client per forward
    batches = list(plan)
    assert len(batches) == 3  # the longest client has 5
    idx = torch.cat([b[0] for b in batches], 1)
    real = torch.cat([b[1] for b in batches], 1)
    assert [b[0].shape[1] for b in batches] == [2, 2, 1]
    assert idx.tolist() == [[7, 8, 9, 9, 9], [0, 0, 0, 0, 0], [1, 2, 3, 4, 5]]
    assert real.tolist() == [[1, 1, 1, 0, 0], [0] * 5, [1] * 5]
    correct = torch.tensor([2, 0, 4])
    assert plan.accuracy(correct).tolist() == pytest.approx([2 / 3, 0.0, 0.8])


def test_fedlaw_draws_one_shuffle_per_epoch_from_the_rounds_stream():
    agg = FedLAW(server_epochs=3, server_batch_size=4)
    epochs = agg.batches(10, torch.Generator().manual_seed(5), torch.device("cpu"))
    g = torch.Generator().manual_seed(5)
    expected = [torch.randperm(10, generator=g) for _ in range(3)]  # one permutation an epoch, in turn
    assert len(epochs) == 3
    for batches, order in zip(epochs, expected):
        assert [b.numel() for b in batches] == [4, 3, 3]  # ceil(10 / 4) = 3 even batches, none of one sample
        assert torch.equal(torch.cat(batches), order)
    whole = FedLAW(server_epochs=2, server_batch_size=0).batches(10, g, torch.device("cpu"))
    assert [[b.tolist() for b in e] for e in whole] == [[list(range(10))]] * 2
