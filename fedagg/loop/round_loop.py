"""The round loop: sample clients, train them, aggregate, evaluate, record, checkpoint.

A round has two phases: `begin(r)` says who trains and how (a `RoundPlan` holding the engine's `RoundJob`),
`end(plan, trained)` takes what they trained through the channel into the aggregate, evaluates and writes.
Who trains the job between them, and when, is a driver's choice (`fedagg.loop.drivers`): one loop alone, or
several loops in step whose jobs one engine call trains together.

Nothing here knows which aggregator runs: what a method needs beyond the parameters it
declares in its `needs`, and the one provider (`fedagg.loop.inputs`) supplies it.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from fedagg.aggregators.base import sample_weights
from fedagg.engines.base import RoundJob, RoundResult
from fedagg.channel.base import Upload
from fedagg.channel.chain import ServerSide
from fedagg.loop.federation import Federation
from fedagg.runtime.checkpoints import rng_state, save_atomically, save_checkpoint, set_rng_state
from fedagg.loop.communication import BitCounter
from fedagg.loop.diagnostics import round_diagnostics
from fedagg.loop.evaluation import client_losses, evaluate, per_client_accuracy, spread
from fedagg.loop.inputs import InputsProvider
from fedagg.loop.timing import RoundTimes, Timed
from fedagg.runtime.interrupts import StopRequests
from fedagg.runtime.progress import RoundProgress
from fedagg.config.settings import Settings
from fedagg.sampling.pool import sampling_pool, sampling_rate
from fedagg.models.adapters.masks import held_entries
from fedagg.models.flat import get_buffers, get_params, set_buffers, set_params
from fedagg.sampling.base import Draw
from fedagg.tracking.files import CSVLog, clean_number, summary_values, write_json

log = logging.getLogger(__name__)


def combine_buffers(buffers: Tensor, weights: Tensor) -> Tensor:
    """The new global buffers from the participants' [K, B] and weights [K], or [K, B] per element."""
    if not buffers.shape[1]:
        return buffers[0]
    weights = weights.to(buffers.dtype)
    return (weights * buffers).sum(dim=0) if weights.dim() == 2 else weights @ buffers


@dataclass
class RoundPlan:
    """A round as `RoundLoop.begin` left it for an engine: its local training (`job`; None when no client
    reported) and what `end` needs of it."""

    round: int
    ids: list[int]  # the reporting clients, in the job's order
    rate: float | None  # the sampling rate (privacy accounting)
    bits: dict  # communicated bits, down and up
    lr: float
    job: RoundJob | None
    timed: Timed | None = None  # on the clock: the round's simulated seconds, who was late (None: no clock)
    # an asynchronous server's step (fedagg.loop.asynchronous): each arrival's start model [K, P] and staleness (server
    # steps since it started), and the step's own columns (the arrivals' mean and largest staleness)
    starts: Tensor | None = None
    staleness: list[int] | None = None
    columns: dict = field(default_factory=dict)


class RoundLoop:
    def __init__(self, fed: Federation, settings: Settings, run_dir: Path, summary_base: dict) -> None:
        self.fed, self.settings, self.run_dir = fed, settings, Path(run_dir)
        self.device = fed.data.device
        self.provider = InputsProvider(fed.aggregator.needs, data=fed.data, model=fed.model, clients=fed.clients,
                                       server_idx=fed.server_idx, solver=fed.trainer.solver(), seed=settings.seed,
                                       adapters=fed.adapters)
        self.params, self.buffers = get_params(fed.model), get_buffers(fed.model)
        self.tested = self.params  # what `evaluate` scores: set by each round's aggregate
        self.metrics, self.weights_log = CSVLog(self.run_dir / "metrics.csv"), CSVLog(self.run_dir / "weights.csv")
        self.clients_log = CSVLog(self.run_dir / "clients.csv")  # per-client accuracy, with eval.per_client
        self.summary = dict(summary_base, status="running", final_test_acc=None, best_test_acc=None,
                            rounds_completed=0, rounds_to_target=None, target_acc=settings.target_acc)
        self.next_round, self.elapsed_before, self.ended = 1, 0.0, False
        # a driver's own state that checkpoints must hold (the asynchronous server's clients in flight and queue):
        # `schedule` while it runs, `resumed_schedule` as a checkpoint left it
        self.schedule, self.resumed_schedule = None, None
        self.summary["server_samples"] = int(fed.server_idx.numel())
        self.summary["uses_extra_data"] = fed.aggregator.needs.uses_extra_data
        self.summary["corrupted_clients"] = fed.corrupted
        self.saved_round, self.saved_summary = 0, dict(self.summary)  # as of the latest checkpoint
        self.corrupted = set(fed.corrupted)
        sizes = torch.tensor([c.num_samples for c in fed.clients], dtype=torch.long)
        self.draw = Draw(settings.seed, sizes, self.client_losses if fed.sampler.needs_losses else None)
        self.bits = BitCounter(fed.aggregator, self.params.numel(), self.buffers.numel(), fed.channel,
                               fed.adapters.layout)
        self.times = RoundTimes(fed.clock)
        if self.times.enabled:
            self.summary.update(self.times.summary(), time_to_target=None)
        # an aggregator with per-client state (FedCAMS's errors) names its stores too; most have none
        stores = {**fed.trainer.client_stores(), **fed.aggregator.client_stores(), **fed.channel.client_stores()}
        for name, store in stores.items():  # per-client state past its memory budget goes here
            store.attach(self.run_dir / "client_state" / name)

    # -- checkpoints ---------------------------------------------------------------------
    def state(self, elapsed: float) -> dict:
        # first: the schedule may train what is in flight, which changes the trainer's state (client stores)
        schedule = None if self.schedule is None else self.schedule.state_dict()
        return {
            "schedule": schedule,
            "round": self.summary["rounds_completed"], "params": self.params, "buffers": self.buffers,
            "aggregator": self.fed.aggregator.state_dict(), "trainer": self.fed.trainer.state_dict(),
            "rng": rng_state(), "summary": self.summary, "elapsed_s": elapsed,
            # how far each CSV file had got, not its rows: resume cuts the files back to this point
            "metrics": self.metrics.mark(), "weights": self.weights_log.mark(), "clients": self.clients_log.mark(),
            "bits": self.bits.state_dict(), "channel": self.fed.channel.state_dict(), "times": self.times.state_dict(),
            "base": self.fed.adapters.base.vector(),  # the frozen base under adapters (FLoRA changes it); else empty
        }

    def restore(self, ckpt: dict) -> None:
        self.params, self.buffers = ckpt["params"].to(self.device), ckpt["buffers"].to(self.device)
        if "base" in ckpt:
            self.fed.adapters.base.load_(ckpt["base"].to(self.device))
        self.fed.aggregator.load_state_dict(ckpt["aggregator"])
        self.fed.trainer.load_state_dict(ckpt["trainer"])
        set_rng_state(ckpt["rng"])
        self.summary.update({k: ckpt["summary"][k] for k in
                             ("final_test_acc", "best_test_acc", "rounds_completed", "rounds_to_target")})
        self.resumed_schedule = ckpt.get("schedule")
        self.times.load_state_dict(ckpt.get("times"))
        if self.times.enabled:
            self.summary.update(self.times.summary(), time_to_target=ckpt["summary"].get("time_to_target"))
        for log_file, key in ((self.metrics, "metrics"), (self.weights_log, "weights"), (self.clients_log, "clients")):
            kept = ckpt.get(key, [])
            # rows written after the checkpoint are dropped; a list is the rows themselves (older checkpoints)
            if isinstance(kept, list):
                log_file.reset(kept)
            else:
                log_file.cut(kept)
        self.bits.load_state_dict(ckpt.get("bits"))
        self.fed.channel.load_state_dict(ckpt.get("channel"))
        self.next_round, self.elapsed_before = ckpt["round"] + 1, ckpt["elapsed_s"]
        self.saved_round, self.saved_summary = ckpt["round"], dict(self.summary)
        log.info("resuming after round %d", ckpt["round"])

    # -- a round in two phases: `begin` says who trains and how, `end` takes what they trained ---------------
    def begin(self, r: int) -> RoundPlan:
        """Who is online, who is sampled and reports, their step budgets and the learning rate: the round's local
        training as a `RoundJob` for an engine (none when no client reported). Draws from the run's own streams
        only, so a driver may begin several loops' rounds before any of them trains."""
        fed, seed = self.fed, self.settings.seed
        online = fed.system.online(seed, r, self.settings.num_clients)
        count = self.times.sampled(self.settings.per_round) or self.settings.per_round  # over-selecting: more than K
        sampled = fed.sampler.choose(count, sampling_pool(self.settings, online), r, self.draw)
        rate = sampling_rate(self.settings, online, count)
        ids = fed.system.reporting(seed, r, sampled)
        lr = fed.trainer.lr_at(r, self.settings.rounds)
        full = [fed.trainer.steps(fed.clients[i]) for i in ids]
        budgets = fed.system.budgets(seed, r, ids, full, fed.trainer.local_epochs) if ids else None
        timed = None
        if self.times.enabled:  # who arrives by the deadline trains; the others are dropped before they do
            timed = self.times.cut(r, len(sampled), ids, budgets, full, [self.bits.up_each(i) for i in ids])
            ids, budgets = timed.ids, timed.budgets
        bits = self.bits.count(sampled, ids)  # down to every sampled client, up from those that report
        if not ids:
            log.warning("round %d: no client %s; the global model is kept", r,
                        "arrived by the deadline" if timed and timed.late else "reported")
            return RoundPlan(r, ids, rate, bits, lr, None, timed)
        chosen = [fed.clients[i] for i in ids]
        return RoundPlan(r, ids, rate, bits, lr, RoundJob(
            fed.model, fed.trainer, fed.data, chosen, self.params, self.buffers, lr=lr, seed=seed, round=r,
            val_indices=self.provider.val_indices(chosen), budgets=budgets), timed)

    def client_losses(self, ids: Tensor, samples: int | None = None, generator: torch.Generator | None = None) -> Tensor:
        """[M] the current global model's mean loss on clients `ids`' training data, for a sampler that scores
        clients (`Draw.losses`); the model is only evaluated, nothing of it counts as training."""
        set_params(self.fed.model, self.params)
        set_buffers(self.fed.model, self.buffers)
        return client_losses(self.fed.model, self.fed.data, [self.fed.clients[i].train_idx for i in ids.tolist()],
                             self.fed.engine.eval_batch_size, samples, generator)

    def end(self, plan: RoundPlan, trained: RoundResult | None) -> bool:
        """The round from what its clients trained (`trained`; None when nobody reported): the upload channel, the
        aggregate, the evaluation, the files and the checkpoint. False when the loop ends with this round
        (its last, diverged, at its target, or asked to stop)."""
        if plan.job is None:  # nobody reported: the global model is kept
            row = {"round": plan.round, "test_acc": None, "test_loss": None, "train_loss": None,
                   "update_norm": 0.0, "lr": plan.lr, "clients": 0, **plan.bits}
        else:
            row = self.aggregate(plan, trained)
        if plan.timed is not None:
            row.update(self.times.add(plan.timed, len(plan.ids) if plan.job is not None else 0))
            self.summary.update(self.times.summary())
        if plan.columns:  # an asynchronous step's staleness
            row.update(plan.columns)
        return self.record(row)

    def aggregate(self, plan: RoundPlan, result: RoundResult) -> dict:
        """The participants' models through the upload channel into the aggregator: the new global model, and the
        round's row of figures."""
        fed, r, ids, rate, lr, bits = self.fed, plan.round, plan.ids, plan.rate, plan.lr, plan.bits
        on_mean = self.transmit(r, ids, result, rate, plan.starts)
        staleness = None if plan.staleness is None else torch.tensor(plan.staleness, device=self.device)
        inputs = self.provider.inputs(self.params, self.buffers, result, ids, r, lr, fed.engine.clients_in_memory,
                                      on_mean, plan.starts, staleness)
        out = fed.aggregator.aggregate(inputs)
        if on_mean.needed and not on_mean.applied:
            raise ValueError(f"channel={fed.channel.shown} is not allowed with aggregator {type(fed.aggregator).__name__}: "
                             "a stage of the channel acts on the weighted mean update, which this rule never forms; "
                             "use a rule that averages the updates (fedavg, fedavgm, fedadam, ...)")
        new_params, weights = out.params, out.weights
        data_weights = sample_weights(inputs.num_samples)
        row = {"round": r, "test_acc": None, "test_loss": None, "train_loss": float(data_weights @ result.train_loss),
               **round_diagnostics(inputs, new_params, weights),
               "lr": lr, "clients": len(ids), **bits, **(sent := fed.channel.metrics()),
               **{f"agg_{k}": v for k, v in out.metrics.items()}}
        for key in sent:
            self.summary.pop(f"final_{key}_infinite", None)  # set again below while the value is infinite
        self.summary.update(summary_values(sent))  # e.g. final_dp_epsilon
        ages = [{}] * len(ids) if plan.staleness is None else [{"staleness": s} for s in plan.staleness]
        if (adapters := fed.adapters.layout) is not None:  # each client's adapter rank
            ages = [dict(age, rank=adapters.client_ranks[i]) for age, i in zip(ages, ids)]
        self.weights_log.extend({"round": r, "client": i, "weight": w, "num_samples": int(n), "local_steps": int(t),
                                 **age} for i, w, n, t, age in zip(ids, weights.tolist(), inputs.num_samples.tolist(),
                                                                   result.local_steps.tolist(), ages))
        self.params, self.tested = new_params, out.tested_params()
        if out.base_update is not None:  # a rule on adapters that changes the frozen base (FLoRA's merge)
            fed.adapters.base.add_(out.base_update)
        self.buffers = (combine_buffers(result.buffers, out.weights_for_buffers()) if out.buffers is None
                        else out.buffers)
        return row

    def transmit(self, r: int, ids: list[int], result: RoundResult, rate: float | None = None,
                 starts: Tensor | None = None) -> ServerSide:
        """What the participants send passes the upload channel (compression, the corrupted clients' attack,
        clipping and noise), in this one place, before aggregation; `rate`: the round's sampling rate; `starts`
        [K, P]: each client's start model where they differ (an asynchronous server), else the global model.
        Returns the channel's server side, for the aggregator's mean update."""
        rows = [k for k, i in enumerate(ids) if i in self.corrupted]
        mask = torch.zeros(len(ids), dtype=torch.bool, device=result.params.device)
        mask[rows] = True
        channel, settings = self.fed.channel, self.settings
        up = Upload(self.params if starts is None else starts, tuple(ids), mask, settings.seed, r,
                    settings.num_clients - len(settings.held_out_ids), rate, self.held(ids))
        arrived = channel.transmit(result.params, up, self.fed.engine.clients_in_memory)  # stages' row blocks
        result.params = arrived.models
        changed = list(range(len(ids))) if channel.stages else rows  # a compressor changes every model
        if changed:
            self.provider.rescore(result, changed, self.fed.engine.eval_batch_size)
        return arrived.on_mean

    def held(self, ids: list[int]) -> Tensor | None:
        """[K, P] bool: the entries of the flat vector each client holds, where adapters of unequal ranks make them
        fewer than P (a client has its own rank's factors); None where every client holds them all."""
        adapters = self.fed.adapters.layout
        if adapters is None:
            return None
        return held_entries(adapters, [self.fed.aggregator.client_rank(adapters, i) for i in ids], self.device)

    def evaluate(self, row: dict) -> None:
        set_params(self.fed.model, self.tested)  # the model the method's paper scores (AggregateResult.evaluated)
        set_buffers(self.fed.model, self.buffers)
        if self.settings.eval_split == "val":
            self.evaluate_on_validation(row)
            return
        acc, loss = evaluate(self.fed.model, self.fed.data.eval_batches(None, self.fed.engine.eval_batch_size))
        row.update(test_acc=acc, test_loss=loss)
        if self.settings.eval_per_client:
            tests = [c.test_idx for c in self.fed.clients]
            accs = self.client_accuracies(tests)
            row.update(spread(accs))
            self.summary.update({f"final_{k}": v for k, v in spread(accs).items()})  # make_table --metric can show them
            self.clients_log.extend({"round": row["round"], "client": c.id, "test_acc": a, "num_test": t.numel()}
                                    for c, a, t in zip(self.fed.clients, accs.tolist(), tests))
        s = self.summary
        s["final_test_acc"], s["best_test_acc"] = acc, max(acc, s["best_test_acc"] or 0.0)
        if self.settings.target_acc is not None and s["rounds_to_target"] is None and acc >= self.settings.target_acc:
            s["rounds_to_target"] = row["round"]
            if self.times.enabled:
                s["time_to_target"] = self.times.sim_time

    def client_accuracies(self, tests: list[Tensor]) -> Tensor:
        """[N] each client's accuracy on its own test split: of the global model, or where the client objective
        gives clients models of their own (FedBN's local normalisation layers), of the model it would start from."""
        fed, batch = self.fed, self.fed.engine.eval_batch_size
        objective = fed.trainer.objective
        if not objective.personal:
            return per_client_accuracy(fed.model, fed.data, tests, batch)
        accs = []
        for client, test in zip(fed.clients, tests):
            params, buffers = objective.start(client.id, self.tested, self.buffers)
            set_params(fed.model, params)
            set_buffers(fed.model, buffers)
            accs.append(per_client_accuracy(fed.model, fed.data, [test], batch))
        set_params(fed.model, self.tested)
        set_buffers(fed.model, self.buffers)
        return torch.cat(accs)

    def evaluate_on_validation(self, row: dict) -> None:
        """eval.split=val (tuning): every client's validation split pooled, each sample once, or with
        eval.held_out_clients all the data of the clients never trained on; the test set is not read, so a choice
        made on these scores cannot have seen it. test_acc stays empty."""
        held = self.settings.held_out_ids
        pool = torch.cat([self.fed.clients[i].train_idx for i in held] + [self.fed.clients[i].val_idx for i in held]
                         if held else [c.val_idx for c in self.fed.clients])
        acc, loss = evaluate(self.fed.model, self.fed.data.eval_batches(pool, self.fed.engine.eval_batch_size, "val"))
        row.update(val_acc=acc, val_loss=loss)
        self.summary["final_val_acc"], self.summary["best_val_acc"] = acc, max(acc, self.summary.get("best_val_acc") or 0.0)

    # -- what a driver calls around the rounds (fedagg.loop.drivers) ------------------------------------------
    @property
    def running(self) -> bool:
        return not self.ended and self.next_round <= self.settings.rounds

    def start(self, stop: StopRequests, progress: RoundProgress,
              clock: Callable[[], float] = time.perf_counter) -> None:
        """Before this process's first round of the run: the stop requests it obeys (a second Ctrl-C waits for its
        writes to end), where its progress goes, and its clock (seconds; a stacked group's driver gives each run
        one that counts only the run's own share of the group's time)."""
        self.stop, self.progress, self.clock = stop, progress, clock
        self.started = clock()

    def elapsed(self) -> float:
        return self.elapsed_before + self.clock() - self.started

    def record(self, row: dict) -> bool:
        """A round's bookkeeping once its model is known: evaluation, progress, files, tracker; then whether the run
        goes on (not diverged, not at its target when it stops there, not asked to stop) and its checkpoint."""
        settings, stop, r = self.settings, self.stop, row["round"]
        self.summary["rounds_completed"] = r
        self.next_round = r + 1
        loss_ok = row["train_loss"] is None or math.isfinite(row["train_loss"])  # None: nobody trained
        diverged = not (loss_ok and bool(torch.isfinite(self.params).all()))
        if not diverged and (r % settings.eval_every == 0 or r == settings.rounds):
            self.evaluate(row)
        self.progress.update(r, row["test_acc"], row["train_loss"])
        if diverged or row["test_acc"] is not None or row.get("val_acc") is not None:
            self.metrics.append({k: clean_number(v) for k, v in {**row, "elapsed_s": round(self.elapsed(), 3)}.items()})
        # the live tracker gets every round's diagnostics, test metrics where evaluated
        self.fed.tracker.log_round(r, {k: v for k, v in row.items() if v is not None})
        if diverged:
            self.summary.update(status="diverged", diverged_round=r)
            # the run's folder: in a stacked group, many runs share this log
            log.warning("round %d: non-finite loss or parameters in %s; stopping (status: diverged)", r, self.run_dir)
            self.ended = True
        elif settings.stop_at_target and self.summary["rounds_to_target"] is not None:
            self.summary["stopped_at_target"] = r  # the table needs no more rounds
            self.ended = True
        elif stop.requested and r < settings.rounds:
            self.summary["status"] = "interrupted"
            self.ended = True
        elif settings.checkpoint_every and r % settings.checkpoint_every == 0 and r < settings.rounds:
            with stop.writing():
                save_checkpoint(self.run_dir, self.state(self.elapsed()))
            self.saved_round, self.saved_summary = r, dict(self.summary)
        return self.running

    def complete(self) -> dict:
        """After the last round the loop ran: its status (completed, unless it diverged or was stopped), files."""
        if self.summary["status"] == "running":
            self.summary["status"] = "completed"
        with self.stop.writing(last=True):
            self.finish(self.elapsed())
        return self.summary

    def failed(self, err: Exception) -> None:
        """An error ended the run (called where it is caught: the traceback goes into summary.json)."""
        self.summary.update(status="failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
        with self.stop.writing(last=True):
            self.finish(self.elapsed())

    def stopped_at_once(self) -> None:
        """A second Ctrl-C: the folder says what resume=true continues from, the latest checkpoint's state,
        interrupted."""
        self.progress.close()
        with self.stop.writing(last=True):
            write_json(self.run_dir / "summary.json", dict(self.saved_summary, status="interrupted"))
        since = (f"the checkpoint after round {self.saved_round}" if self.saved_round else
                 "round 1 (no checkpoint was written yet)")
        again = "the same command" if self.summary["config"].get("resume") else "resume=true with the same settings"
        log.warning("stopped at once; %s continues from %s", again, since)

    def finish(self, elapsed: float) -> None:
        self.summary["wall_time_s"] = round(elapsed, 3)
        self.summary["finished_at"] = round(time.time(), 3)  # with wall_time_s: when it ran, for the time spent
        if self.summary["status"] in ("completed", "interrupted"):
            save_checkpoint(self.run_dir, self.state(elapsed))
        set_params(self.fed.model, self.params)
        set_buffers(self.fed.model, self.buffers)
        # CPU tensors: model.pt opens anywhere, without map_location; adapters merged into the weights they adapt
        save_atomically(self.fed.adapters.model_state(self.fed.model), self.run_dir / "model.pt")
        write_json(self.run_dir / "summary.json", self.summary, lenient=self.summary["status"] == "failed")


def federation_loop(fed: Federation, settings: Settings, run_dir: Path, summary_base: dict,
                    checkpoint: dict | None = None) -> RoundLoop:
    """The run's loop, at its first round or, from `checkpoint`, the round after it."""
    loop = RoundLoop(fed, settings, run_dir, summary_base)
    if checkpoint is not None:
        loop.restore(checkpoint)
    return loop
