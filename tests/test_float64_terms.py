"""A float64 model's loss and objective terms are taken in float64: the task loss, FedNTD's and FedDecorr's terms
were `.float()`-ed (float32, errors up to ~4e-7); half precision is still taken in float32."""

import math

import pytest
import torch

from fedagg.clients.feddecorr import FedDecorr
from fedagg.clients.fedntd import FedNTD
from fedagg.clients.objectives import Seen
from fedagg.clients.trainer import LocalSGD
from fedagg.models.base import Representation, at_least_float32

F64 = torch.float64


def test_the_task_loss_of_float64_logits_is_float64_by_hand():
    logits = torch.tensor([[0.1, 0.2, 0.3], [1.0, -1.0, 0.5]], dtype=F64)
    y = torch.tensor([0, 2])
    ce = [math.log(math.exp(0.1) + math.exp(0.2) + math.exp(0.3)) - 0.1,
          math.log(math.exp(1.0) + math.exp(-1.0) + math.exp(0.5)) - 0.5]
    total, task = LocalSGD().loss(logits, y, None)
    assert total.dtype == F64 and task.item() == pytest.approx(sum(ce) / 2, abs=1e-15)
    per = LocalSGD().stacked_task_losses(logits.view(2, 1, 3), y.view(2, 1))
    assert per.dtype == F64 and per.tolist() == pytest.approx(ce, abs=1e-15)


def test_fedntd_term_of_float64_logits_is_float64_by_hand():
    # y = 0: the local not-true logits [0.5, 0.9], the teacher's [0.2, 0.7]; tau = beta = 1: KL(p || q)
    seen = Seen(torch.tensor([0]), Representation(None, torch.tensor([[0.1, 0.5, 0.9]], dtype=F64)),
                Representation(None, torch.tensor([[0.3, 0.2, 0.7]], dtype=F64)))
    q = [math.exp(a) / (math.exp(0.5) + math.exp(0.9)) for a in (0.5, 0.9)]
    p = [math.exp(a) / (math.exp(0.2) + math.exp(0.7)) for a in (0.2, 0.7)]
    term = FedNTD(tau=1.0, beta=1.0).forward_term(seen)
    assert term.dtype == F64 and term.item() == pytest.approx(sum(a * math.log(a / b) for a, b in zip(p, q)), abs=1e-16)


def test_feddecorr_term_of_float64_features_is_float64_by_hand():
    # centred [[-1, -1], [0, 1], [1, 0]], both variances 1: gram [[2, 1], [1, 2]] / (1 + 1e-8); the batch form is
    # beta * (sum of squared off-diagonal entries) / (d (d - 1)) / n = 0.1 * 2 / (1 + 1e-8)^2 / 2 / 3
    h = torch.tensor([[0.0, 0.0], [1.0, 2.0], [2.0, 1.0]], dtype=F64)
    term = FedDecorr(beta=0.1).forward_term(Seen(torch.zeros(3, dtype=torch.long), Representation(h, None)))
    assert term.dtype == F64 and term.item() == pytest.approx(0.1 / 3 / (1 + 1e-8) ** 2, abs=1e-17)


def test_half_precision_is_taken_in_float32():
    for dtype, shown in ((torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.float32, torch.float32),
                         (F64, F64)):
        assert at_least_float32(torch.ones(2, dtype=dtype)).dtype == shown
    logits = torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.bfloat16)
    assert LocalSGD().loss(logits, torch.tensor([0]), None)[0].dtype == torch.float32
