"""The round loop: sample clients, train them, aggregate, evaluate, record.

Nothing here knows which aggregator runs: what a method needs beyond the parameters
(validation accuracy, every client's data size, ...) it declares in `requires`, and the
loop supplies it.
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
from fedagg.diagnostics import round_diagnostics
from fedagg.evaluation import evaluate
from fedagg.federation import Settings, sample_clients
from fedagg.params import ParamLayout, get_buffers, get_params, set_buffers, set_params
from fedagg.tracking.base import Tracker
from fedagg.tracking.files import CSVLog, clean_number, write_json

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
    server_idx: Tensor | None = None  # training-pool samples the server holds out (never a client's)


def check_requirements(fed: Federation) -> None:
    """Fail before training when the aggregator needs something this setup cannot give."""
    agg = fed.aggregator
    missing = set(agg.requires) - PROVIDED
    if missing:
        raise ValueError(f"aggregator requires {sorted(missing)}, which the round loop cannot provide")
    if "val_acc" not in agg.requires:
        return
    source = getattr(agg, "val_source", "local")
    if source == "local" and any(c.val_idx.numel() == 0 for c in fed.clients):
        raise ValueError(
            f"aggregator {type(agg).__name__} weights clients by validation accuracy (val_source=local), but "
            f"client.val_frac={fed.trainer.val_frac}; set client.val_frac to a fraction in (0, 1), e.g. 0.1, "
            "or leave it null to get 0.1"
        )
    if source == "server" and (fed.server_idx is None or fed.server_idx.numel() == 0):
        raise ValueError(f"aggregator {type(agg).__name__} has val_source=server but no server split was held out")


def combine_buffers(buffers: Tensor, weights: Tensor) -> Tensor:
    return weights.to(buffers.dtype) @ buffers if buffers.shape[1] else buffers[0]


def validation_indices(fed: Federation, chosen: list[ClientData]) -> list[Tensor] | None:
    """Where each participant's trained model is scored, when the aggregator asks for val_acc."""
    if "val_acc" not in fed.aggregator.requires:
        return None
    if getattr(fed.aggregator, "val_source", "local") == "server":
        return [fed.server_idx] * len(chosen)
    return [c.val_idx for c in chosen]


def run_federation(fed: Federation, settings: Settings, run_dir: Path, summary_base: dict) -> dict:
    check_requirements(fed)
    run_dir = Path(run_dir)
    device = fed.data.device
    layout = ParamLayout.of(fed.model)
    params, buffers = get_params(fed.model), get_buffers(fed.model)
    all_num_samples = torch.tensor([c.num_samples for c in fed.clients], device=device)
    metrics, weights_log = CSVLog(run_dir / "metrics.csv"), CSVLog(run_dir / "weights.csv")
    summary = dict(summary_base, status="running", final_test_acc=None, best_test_acc=None,
                   rounds_completed=0, rounds_to_target=None, target_acc=settings.target_acc)
    start = time.perf_counter()
    bar = tqdm(range(1, settings.rounds + 1), desc="rounds", unit="round", dynamic_ncols=True, mininterval=1.0)
    for r in bar:
        chosen = [fed.clients[i] for i in sample_clients(settings, r)]
        lr = fed.trainer.lr_at(r, settings.rounds)
        result = fed.engine.train_round(
            fed.model, params, buffers, chosen, fed.trainer, fed.data,
            lr=lr, seed=settings.seed, round=r, val_indices=validation_indices(fed, chosen),
        )
        num_samples = all_num_samples[[c.id for c in chosen]]
        ids = torch.tensor([c.id for c in chosen], device=device)
        new_params = fed.aggregator.aggregate(
            params, result.params, num_samples, client_ids=ids, round=r, layout=layout,
            val_acc=result.val_acc, all_num_samples=all_num_samples,
        )
        data_weights = sample_weights(num_samples)
        weights = fed.aggregator.last_weights if fed.aggregator.last_weights is not None else data_weights
        row = {"round": r, "test_acc": None, "test_loss": None, "train_loss": float(data_weights @ result.train_loss),
               **round_diagnostics(params, new_params, result.params, weights), "lr": lr, "clients": len(chosen)}
        weights_log.extend({"round": r, "client": c.id, "weight": float(w), "num_samples": c.num_samples}
                           for c, w in zip(chosen, weights.tolist()))
        params, buffers = new_params, combine_buffers(result.buffers, fed.aggregator.buffer_weights(num_samples))
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
            metrics.append({k: clean_number(v) for k, v in row.items()})
            summary["final_test_acc"] = acc
            summary["best_test_acc"] = max(acc, summary["best_test_acc"] or 0.0)
            if settings.target_acc is not None and summary["rounds_to_target"] is None and acc >= settings.target_acc:
                summary["rounds_to_target"] = r
            bar.set_postfix(acc=f"{acc:.4f}", loss=f"{row['train_loss']:.4f}")
        # the live tracker gets the diagnostics of every round, test metrics where evaluated
        fed.tracker.log_round(r, {k: v for k, v in row.items() if v is not None})
    bar.close()
    if summary["status"] == "running":
        summary["status"] = "completed"
    summary["wall_time_s"] = round(time.perf_counter() - start, 3)
    set_params(fed.model, params)
    set_buffers(fed.model, buffers)
    torch.save(fed.model.state_dict(), run_dir / "model.pt")
    write_json(run_dir / "summary.json", summary)
    return summary
