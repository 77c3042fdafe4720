"""The round loop: sample clients, train them, aggregate, evaluate, record.

Nothing here knows which aggregator runs: what a method needs beyond the parameters
(validation accuracy, ...) it declares in `requires`, and the loop supplies it.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from fedagg.aggregators.base import Aggregator, sample_weights
from fedagg.client import ClientData, LocalSGD
from fedagg.evaluation import evaluate
from fedagg.federation import Settings, sample_clients
from fedagg.params import ParamLayout, get_buffers, get_params, set_buffers, set_params
from fedagg.tracking.base import Tracker
from fedagg.tracking.files import MetricsCSV, clean_number, write_json

PROVIDED = frozenset({"val_acc"})
log = logging.getLogger(__name__)


@dataclass
class Federation:
    data: object  # DeviceData
    model: nn.Module
    clients: list[ClientData]
    aggregator: Aggregator
    trainer: LocalSGD
    engine: object
    tracker: Tracker = field(default_factory=Tracker)


def check_requirements(fed: Federation) -> None:
    """Fail before training when the aggregator needs something this setup cannot give."""
    missing = set(fed.aggregator.requires) - PROVIDED
    if missing:
        raise ValueError(f"aggregator requires {sorted(missing)}, which the round loop cannot provide")
    if "val_acc" in fed.aggregator.requires and fed.trainer.val_frac <= 0:
        raise ValueError(
            f"aggregator {type(fed.aggregator).__name__} requires validation accuracy, but client.val_frac="
            f"{fed.trainer.val_frac}; set client.val_frac to a fraction in (0, 1), e.g. client.val_frac=0.1"
        )


def combine_buffers(buffers: Tensor, weights: Tensor) -> Tensor:
    return weights @ buffers if buffers.shape[1] else buffers[0]


def run_federation(fed: Federation, settings: Settings, run_dir: Path, summary_base: dict) -> dict:
    check_requirements(fed)
    run_dir = Path(run_dir)
    device = fed.data.device
    layout = ParamLayout.of(fed.model)
    params, buffers = get_params(fed.model), get_buffers(fed.model)
    metrics = MetricsCSV(run_dir / "metrics.csv")
    summary = dict(summary_base, status="running", final_test_acc=None, best_test_acc=None,
                   rounds_completed=0, rounds_to_target=None, target_acc=settings.target_acc)
    start = time.perf_counter()
    bar = tqdm(range(1, settings.rounds + 1), desc="rounds", unit="round", dynamic_ncols=True, mininterval=1.0)
    for r in bar:
        chosen = [fed.clients[i] for i in sample_clients(settings, r)]
        lr = fed.trainer.lr_at(r, settings.rounds)
        result = fed.engine.train_round(
            fed.model, params, buffers, chosen, fed.trainer, fed.data,
            lr=lr, seed=settings.seed, round=r, with_val_acc="val_acc" in fed.aggregator.requires,
        )
        num_samples = torch.tensor([c.num_samples for c in chosen], device=device)
        ids = torch.tensor([c.id for c in chosen], device=device)
        new_params = fed.aggregator.aggregate(
            params, result.params, num_samples, client_ids=ids, round=r, layout=layout, val_acc=result.val_acc
        )
        data_weights = sample_weights(num_samples)
        weights = fed.aggregator.last_weights if fed.aggregator.last_weights is not None else data_weights
        buffer_weights = fed.aggregator.buffer_weights(num_samples)
        row = {
            "round": r,
            "test_acc": None,
            "test_loss": None,
            "train_loss": float(data_weights @ result.train_loss),
            "update_norm": float(torch.linalg.vector_norm(new_params - params)),
            "client_update_norm": float(weights @ torch.linalg.vector_norm(result.params - params, dim=1)),
            "lr": lr,
            "clients": len(chosen),
        }
        params, buffers = new_params, combine_buffers(result.buffers, buffer_weights)
        summary["rounds_completed"] = r
        if not (math.isfinite(row["train_loss"]) and bool(torch.isfinite(params).all())):
            summary.update(status="diverged", diverged_round=r)
            log.warning("round %d: non-finite loss or parameters; stopping (status: diverged)", r)
            break
        if r % settings.eval_every == 0 or r == settings.rounds:
            set_params(fed.model, params)
            set_buffers(fed.model, buffers)
            acc, loss = evaluate(fed.model, fed.data.eval_batches(None, fed.engine.eval_batch_size))
            row.update(test_acc=acc, test_loss=loss, elapsed_s=round(time.perf_counter() - start, 3))
            row = {k: clean_number(v) for k, v in row.items()}
            metrics.append(row)
            fed.tracker.log_round(r, row)
            summary["final_test_acc"] = acc
            summary["best_test_acc"] = max(acc, summary["best_test_acc"] or 0.0)
            if settings.target_acc is not None and summary["rounds_to_target"] is None and acc >= settings.target_acc:
                summary["rounds_to_target"] = r
            bar.set_postfix(acc=f"{acc:.4f}", loss=f"{row['train_loss']:.4f}" if row["train_loss"] is not None else "nan")
    bar.close()
    if summary["status"] == "running":
        summary["status"] = "completed"
    summary["wall_time_s"] = round(time.perf_counter() - start, 3)
    set_params(fed.model, params)
    set_buffers(fed.model, buffers)
    torch.save(fed.model.state_dict(), run_dir / "model.pt")
    write_json(run_dir / "summary.json", summary)
    return summary
