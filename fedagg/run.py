"""The Hydra edge: compose the config, instantiate the parts, run the federation.

`python -m fedagg.run [group=option ...] [key=value ...]` (add `-m` for a sweep). Only this
module and `fedagg/edge` (command-line messages, the sweep's callback, the checks of a job) import Hydra;
`train(cfg, run_dir)` runs a composed config and
`run_experiment(overrides, run_dir)` composes and runs one job as the command line does.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command line: partition.png's process imports matplotlib while this one imports torch
    from fedagg.data.painter import start_drawing

    start_drawing()

import contextlib  # noqa: E402
import gc
import json
import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationKeyError

from fedagg.data.partition_report import drawn, partition_title, save_partition_report
from fedagg.edge import CONF
from fedagg.edge import run_log, start_up
from fedagg.edge.channel_choice import channel_choice, uniform_mean_for_privacy
from fedagg.edge.command_line import explain_composition_error, in_user_words  # noqa: F401  (an API)
from fedagg.edge.start import exit_now, job_started, start
from fedagg.edge.default_model import with_default_model
from fedagg.edge.job_checks import (FolderHeld, SetupError, check_no_ignored_choice, check_run,  # noqa: F401
                                    checked_settings, explain_missing_option, instantiate_parts, settings_from,
                                    user_error_of)
from fedagg.edge.sweep import SweepSummary, concurrent_jobs, first_time
from fedagg.loop.assembly import assemble
from fedagg.runtime.checkpoints import load_checkpoint
from fedagg.runtime import interrupts, threads
from fedagg.runtime.folder import RunFolder, clear_run, held_run, held_sweep
from fedagg.runtime.numerics import numerics
from fedagg.loop.round_loop import RoundLoop, federation_loop
from fedagg.config.names import DISPLAY_NAME
from fedagg.config.schema import respelled
from fedagg.data.device import resolve_device
from fedagg.engines.auto import AUTO, CHOICE, PARALLEL, PICKED, REASON, recorded_engine, stacked_alike
from fedagg.engines.choice import Picked
from fedagg.results.groups import GROUPS, RECORDED_CHOICES, method_name_of, method_of  # noqa: F401  (GROUPS: the API)
from fedagg.tracking.files import write_json

log = logging.getLogger("fedagg")


def _read_summary(run_dir: Path) -> dict | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


# classes that moved: a checkpoint written before the move names the old place, and resumes as the same setting
MOVED_TARGETS = {"fedagg.channel.base.Channel": "fedagg.channel.chain.Channel"}
# groups added after runs were written, with the option such a run ran as: its config lacks the group, and
# resume=true (a sweep re-launched to skip what completed) must not see a change there
ADDED_LATER = {"clock": {"_target_": "fedagg.system.clock.Clock"}, "sampler": {"_target_": "fedagg.sampling.base.Sampler"},
               "server": {"_target_": "fedagg.loop.server.Synchronous"}}


def _changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if k == "_target_":
            a = MOVED_TARGETS.get(a, a)
        if not prefix and k not in old and k in ADDED_LATER and b == ADDED_LATER[k]:
            continue
        if not prefix and k == "engine" and stacked_alike(a, b):  # engine=auto trained stacked: the same job
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _changed_keys(a, b, f"{prefix}{k}.")
        elif a != b and f"{prefix}{k}" not in ("resume", "overwrite") and k != DISPLAY_NAME:  # a name computes nothing
            keys.append(f"{prefix}{k}")
    return keys


class Prepared:
    """A run ready for its rounds (`loop`), with what stays open until it ends: the folder's lock, torch's numeric
    switches, the tracker, the partition picture being drawn. `summary` instead of a loop: resume=true found the
    run completed. `close()` (or the end of a `with` block) lets go of them, in the reverse order."""

    def __init__(self, run_dir: Path, stack: contextlib.ExitStack, loop: RoundLoop | None = None,
                 summary: dict | None = None) -> None:
        self.run_dir, self.stack, self.loop, self.summary = run_dir, stack, loop, summary

    def close(self) -> None:
        self.stack.close()

    def __enter__(self) -> "Prepared":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def finished(self, summary: dict) -> dict:
        """Close, and say in one line how the run ended."""
        self.close()
        report(summary, self.run_dir, self.loop is not None and self.loop.fed.trainer.objective.personal)
        return summary


def train(cfg: DictConfig, run_dir: str | Path, choices: dict | None = None, overrides: list[str] | None = None,
          concurrent_jobs: int = 1) -> dict:
    """Run (or resume) one experiment described by a composed config; write its files to run_dir, which no
    other run may use meanwhile. `concurrent_jobs`: how many jobs a launcher runs at once on this machine."""
    run = prepare(cfg, run_dir, choices, overrides, concurrent_jobs)
    with run:
        if run.loop is None:
            return run.summary
        summary = run.loop.fed.server.drive(run.loop)  # rounds, or arrivals on the clock (server=async)
    return run.finished(summary)


def prepare(cfg: DictConfig, run_dir: str | Path, choices: dict | None = None, overrides: list[str] | None = None,
            concurrent_jobs: int = 1) -> Prepared:
    """Everything `train` does before the first round: the run's loop, its folder held until `Prepared.close`."""
    run_dir = Path(run_dir)
    stack = contextlib.ExitStack()
    try:
        folder = RunFolder(run_dir).acquire()
    except ValueError as err:
        raise SetupError(str(err)) from None
    stack.callback(folder.release)
    try:
        with start_up.preparing():  # a sweep's console says these lines once (fedagg/edge/start_up.py)
            return _prepare_run(cfg, run_dir, choices or {}, overrides or [], concurrent_jobs, stack)
    except SetupError as err:  # a number in the message as the user typed it (1e300, not 1e+300)
        stack.close()
        if (words := in_user_words(str(err), overrides or [])) != str(err):
            raise type(err)(words) from err
        raise
    except BaseException:
        stack.close()
        raise


def _prepare_run(cfg: DictConfig, run_dir: Path, choices: dict, overrides: list[str], concurrent_jobs: int,
                 stack: contextlib.ExitStack) -> Prepared:
    try:
        choices = dict(choices)  # the caller's stays as given
        if (channel := channel_choice(overrides)) is not None:
            choices["channel"] = channel  # Hydra records no choice for a list
        cfg, model_note = with_default_model(cfg, choices)
    except ValueError as err:
        raise SetupError(str(err)) from None
    if sweep := held_sweep(run_dir):
        raise FolderHeld(f"{run_dir} holds {sweep}; a run written there would hide them from tables and reports, and "
                         "nothing there was changed: use another hydra.run.dir")
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except InterpolationKeyError as err:
        raise SetupError(explain_missing_option(cfg, err, choices)) from None
    cfg, weighting_note = uniform_mean_for_privacy(cfg, overrides)
    if weighting_note is not None:
        config = OmegaConf.to_container(cfg, resolve=True)
    # plain values (the resolved config's), not the config's nodes: a summary is written even when a key holds a list
    summary_base = {"seed": config.get("seed"), "method": method_of(choices, config),
                    "method_name": method_name_of(choices, config), "choices": choices, "overrides": overrides,
                    "config": config, "experiment_scale": config.get("experiment_scale")}
    if cfg.get("resume") is True and cfg.get("overwrite") is True:
        raise SetupError("resume=true and overwrite=true contradict each other: resume=true continues the run in the "
                         "folder, overwrite=true replaces it; choose one")
    previous = _read_summary(run_dir)
    held = held_run(run_dir)  # read under the folder's lock, before anything is written
    if held is None:  # nothing of another run is there: the folder is this run's
        clear_run(run_dir)  # what a run that never completed a round left (its setup's files) mixes with nothing
        run_log.claim(run_dir, fresh=True)
    if cfg.resume and previous is not None and previous.get("status") == "completed":
        if changed := _changed_keys(previous.get("config", {}), config):
            raise FolderHeld(f"resume=true but {run_dir} holds a completed run whose configuration differs in "
                             f"{', '.join(changed)}; nothing there was changed: use a new hydra.run.dir")
        log.info("%s already completed; skipping it (resume=true)", run_dir)
        return Prepared(run_dir, stack, summary=previous)
    stack.enter_context(numerics(cfg.deterministic is True, cfg.tf32 is True))  # the values are checked in _prepare
    try:
        loop = _prepare(cfg, run_dir, choices, config, summary_base, held)
    except KeyboardInterrupt:
        log.warning("stopped before the first round: nothing was computed")
        raise interrupts.StoppedNow from None
    except Exception as err:
        if held is None:  # never touch an earlier run's folder
            write_json(run_dir / "summary.json", dict(summary_base, status="failed",
                                                      error=f"{type(err).__name__}: {err}",
                                                      traceback=traceback.format_exc()), lenient=True)
        if isinstance(err, SetupError):
            raise
        if (user_error := user_error_of(err)) is not None:
            raise SetupError(str(user_error)) from err
        raise
    fed = loop.fed
    num_params = sum(p.numel() for p in fed.model.parameters())
    # the default backbone's reason joins this line, after the setup: a configuration error stays one line;
    # the training samples are the clients' (experiment_scale shrinks them as it shrinks the test set)
    log.info("%s: %d train / %d test samples, %d clients, %s with %d parameters on %s%s", fed.data.name,
             fed.partition["total"], fed.data.test_y.numel(), len(fed.clients), type(fed.model).__name__,
             num_params, summary_base["device"], f" ({model_note})" if model_note else "")
    for note in [fed.picked and fed.picked.line(), fed.adapters.line, weighting_note, *fed.channel.notes()]:
        if note:
            log.info("%s", note)
    threads.apply(cfg.threads, num_params, concurrent_jobs)
    fed.tracker.start(run_dir, config, name=run_dir.name)
    stack.callback(lambda: fed.tracker.finish(_read_summary(run_dir) or {"status": "failed"}))
    stack.callback(drawn)  # partition.png, drawn while the first rounds ran
    fed.tracker.log_image("partition", run_dir / "partition.png")
    return Prepared(run_dir, stack, loop=loop)


def report(summary: dict, run_dir: Path, personal: bool = False) -> None:
    """One line: how the run ended, with the number its user reads: the global test accuracy, or where clients keep
    models of their own (`personal`: FedBN's normalisation layers) the mean of each client's accuracy with its own
    (eval.per_client=true); and how soon it reached target_acc."""
    where = f"after {summary['rounds_completed']} rounds ({run_dir})"
    client_mean = summary.get("final_client_acc_mean")
    if summary["final_test_acc"] is None and summary.get("final_val_acc") is not None:  # eval.split=val
        result = f"final validation accuracy {summary['final_val_acc']:.4f}"
    elif summary["final_test_acc"] is None:
        log.info("%s %s, never evaluated", summary["status"], where)
        return
    elif personal and client_mean is not None:
        result = (f"mean client accuracy {client_mean:.4f} (each client's own model on its own test split; the averaged "
                  f"model's test accuracy {summary['final_test_acc']:.4f})")
    elif personal:  # the test set scores an average no client holds
        result = (f"final test accuracy {summary['final_test_acc']:.4f} of the averaged model, which no client holds "
                  "(eval.per_client=true scores each client's own)")
    else:
        result = f"final test accuracy {summary['final_test_acc']:.4f}" + (
            f", mean client accuracy {client_mean:.4f}" if client_mean is not None else "")
    log.info("%s: %s %s%s", summary["status"], result, where, _to_target(summary))


def _to_target(summary: dict) -> str:
    """`; target_acc 0.9 reached at round 12, time_to_target 85.3 s`, or that it was not reached; '' without one."""
    target = summary.get("target_acc")
    if target is None:
        return ""
    if summary.get("rounds_to_target") is None:
        return f"; target_acc {target} not reached"
    time = summary.get("time_to_target")
    return (f"; target_acc {target} reached at round {summary['rounds_to_target']}"
            + (f", time_to_target {time:.1f} s" if time is not None else ""))


def _sweep_job() -> bool:
    """Whether this run is one job of a sweep: there, resume=true on a folder with nothing in it is the normal start of
    a job (a comparison sets it for each of its runs), not worth a line each."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _prepare(cfg: DictConfig, run_dir: Path, choices: dict, config: dict, summary_base: dict,
             held: str | None) -> RoundLoop:
    """Everything that can reject the configuration, before any data is loaded; then the folder (`held`: the
    earlier run it holds, if any); then the data, the clients, the model and the round loop (resumed from its
    checkpoint, whose files it checks), all before the run's first file is written. Returns the loop."""
    settings = checked_settings(cfg, choices)
    device = resolve_device(cfg.device)
    summary_base["device"] = device.type  # the random streams of a run depend on it
    parts = instantiate_parts(cfg, choices)
    if held is not None and cfg.overwrite:
        clear_run(run_dir)
        run_log.claim(run_dir, fresh=True)  # the replaced run's log goes with it
        log.warning("overwrite=true: removed %s from %s", held, run_dir)
    elif held is not None and not cfg.resume:
        raise FolderHeld(f"{run_dir} holds {held}; nothing was changed: continue it with resume=true, keep it with "
                         "another hydra.run.dir or hydra.sweep.dir, or replace it with overwrite=true")
    checkpoint = load_checkpoint(run_dir, device) if cfg.resume else None
    if cfg.resume and checkpoint is None and (held is not None or not _sweep_job()):
        log.info("resume=true but %s has no checkpoint yet: starting from round 1", run_dir)
    # the device first: it differs in the config too, and the line below says why it matters
    started = checkpoint["summary"].get("device", device.type) if checkpoint is not None else device.type
    if started != device.type:
        raise ValueError(f"resume=true on {device.type}, but the run started on {started}, where its random streams "
                         f"differ: resume it with device={started}, or start a new run")
    if checkpoint is not None and (changed := _changed_keys(checkpoint["summary"]["config"], config)):
        raise FolderHeld(f"resume=true but the configuration differs from the checkpoint's in {', '.join(changed)}; "
                         "resume with the same settings or use a new hydra.run.dir")
    if checkpoint is not None:
        _keep_recorded_engine(cfg, summary_base, parts, checkpoint["summary"], device.type)
    run_log.claim(run_dir, fresh=False)  # resumed: its log goes on (claimed already when the folder held nothing)
    fed = assemble(parts, settings, data_root=cfg.data.root, device=device, experiment_scale=cfg.experiment_scale,
                   download=cfg.data.download)
    if fed.picked is not None:  # what engine=auto picked: a resume keeps it
        summary_base.update({PICKED: fed.picked.engine, REASON: fed.picked.reason})
    # fed.settings: num_clients=null is now the dataset's number of clients
    loop = federation_loop(fed, fed.settings, run_dir, summary_base, checkpoint)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    save_partition_report(fed.partition, run_dir, partition_title(choices.get("partition"), config.get("partition") or {},
                                                                   choices.get("dataset")))
    return loop


def _keep_recorded_engine(cfg: DictConfig, summary_base: dict, parts, recorded_summary: dict, device: str) -> None:
    """A resumed engine=auto job goes on with the engine that trained its earlier rounds: the parallel engine when
    a stacked sweep trained it (resumed alone); when it ran alone (resumed stacked, or alone again), the pick its
    summary recorded, or for a run written before engine=auto recorded one, what it picked then: the sequential
    engine on the CPU, the parallel one on a GPU. The job's config records that engine, as it did."""
    recorded = recorded_summary["config"].get("engine")
    kept = None if recorded is None else recorded_engine(recorded, summary_base["config"].get("engine"))
    node = summary_base["config"].get("engine") if kept is None else kept
    if isinstance(node, dict) and node.get("_target_") == AUTO and recorded == node:
        parts.engine = instantiate(node).keep(_recorded_pick(recorded_summary, device))
    if kept is None:
        return
    if kept["_target_"] != AUTO:
        parts.engine = instantiate(kept)
    summary_base["config"]["engine"] = kept
    summary_base["choices"]["engine"] = CHOICE[kept["_target_"]]
    with open_dict(cfg):
        cfg.engine = OmegaConf.create(kept)
    log.info("resumed with engine %s, which trained its earlier rounds (engine=auto %s)", kept["_target_"],
             "in a stacked sweep" if kept["_target_"] == PARALLEL else "alone")


def _recorded_pick(summary: dict, device: str) -> Picked:
    """What engine=auto picked for a run, from its summary; for a run from before it recorded one, its pick then."""
    if summary.get(PICKED) is not None:
        return Picked(summary[PICKED], summary.get(REASON) or "")
    if device == "cuda":
        return Picked("parallel", "on a GPU, as engine=auto picked when this run started")
    return Picked("sequential", "on the CPU, as engine=auto picked when this run started")


def run_experiment(overrides: list[str], run_dir: str | Path) -> dict:
    """Compose `overrides` as `python -m fedagg.run OVERRIDES` does (searchpath and experiment files included),
    run that one job in `run_dir` and return its summary. A bad configuration raises `SetupError`."""
    overrides = respelled(list(overrides))  # model.adapter=lora -> adapter=lora, as on the command line
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # `${hydra:runtime.choices...}` in experiment files resolves as on the CLI
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if k in RECORDED_CHOICES}
    with open_dict(cfg):
        del cfg["hydra"]
    return train(cfg, run_dir, choices, overrides)


def job_of(hydra_cfg) -> tuple[str, dict, list[str], int]:
    """What `train` takes of a sweep's or a single run's Hydra config: the run's folder, the recorded choices, the
    overrides as typed, and how many jobs the launcher runs at once."""
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if k in RECORDED_CHOICES}
    return hydra_cfg.runtime.output_dir, choices, list(hydra_cfg.overrides.task), concurrent_jobs(hydra_cfg)


def job_outcome(run_dir: str | Path, resume: bool, summary: dict | None = None,
                 error: BaseException | None = None) -> dict:
    """What a sweep's job returns for the sweep's count (SweepSummary), from its summary or what stopped it, after
    a line saying so: the sweep goes on, and says at its end what failed or was interrupted."""
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C during the setup, or twice
        if not isinstance(error, interrupts.StoppedNow):  # StoppedNow: the run has said how far it got
            log.warning("stopped (Ctrl-C)")
        return {"status": "interrupted"}
    if isinstance(error, SetupError):  # a user error, not a bug: the message alone, without a traceback
        # said once a sweep: every job missing the same data fails alike (the sweep's end counts them)
        log.log(logging.ERROR if first_time(str(error)) else logging.DEBUG, "%s", error)
        return {"status": "failed", "error": str(error), "folder_held": isinstance(error, FolderHeld)}
    if error is not None:  # the traceback is in the job's summary.json, the count at the sweep's end
        log.error("job failed: %s: %s (traceback in %s)", type(error).__name__, error, Path(run_dir) / "summary.json")
        return {"status": "failed", "error": f"{type(error).__name__}: {error}"}
    if summary["status"] == "interrupted":
        log.warning("interrupted after round %d; %s continues from its checkpoint", summary["rounds_completed"],
                    "the same command" if resume else "resume=true with the same settings")
    return {"status": summary["status"]}


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict | None:
    job_started()
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.RUN and not str(hydra_cfg.run.dir).strip():
        log.error("hydra.run.dir='' is not allowed: every result file would land in the current folder; give a folder")
        sys.exit(2)
    run_dir, choices, overrides, at_once = job_of(hydra_cfg)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        if SweepSummary.stopping():
            return {"status": "not started"}  # the sweep was stopped before this job began
        try:
            return job_outcome(run_dir, cfg.resume, summary=train(cfg, run_dir, choices, overrides, at_once))
        except (KeyboardInterrupt, Exception) as err:  # in a sweep the others go on
            return job_outcome(run_dir, cfg.resume, error=err)
    try:
        summary = train(cfg, run_dir, choices, overrides, at_once)
    except KeyboardInterrupt as err:  # Ctrl-C during the setup, or twice
        job_outcome(run_dir, cfg.resume, error=err)
        sys.exit(130)
    except SetupError as err:
        log.error("%s", err)
        sys.exit(2)
    # any other error: a single run shows where it broke
    if summary["status"] == "interrupted":
        job_outcome(run_dir, cfg.resume, summary=summary)
        sys.exit(130)  # the shell's code for an interrupt; a sweep says it at its end
    return {"status": summary["status"]}


if __name__ == "__main__":
    # Launchers that run jobs in other processes (joblib, submitit) pickle the task: functions of
    # this __main__ copy are pickled by value, which train() cannot be, while fedagg.run's are
    # pickled by name. Rebinding train (and SetupError and FolderHeld, which main() catches) to the
    # importable module's keeps Hydra's config path relative to this file.
    from fedagg.run import FolderHeld, SetupError, SweepSummary, train  # noqa: F401,F811

    # What the imports made lives as long as the process: out of the collector's sight, neither a collection during
    # the run nor the interpreter's exit walks it again (torch's objects made the exit of a run 0.4 s longer)
    gc.freeze()
    try:
        sys.argv[1:] = respelled(sys.argv[1:])  # model.adapter=lora is adapter=lora (Hydra reads sys.argv itself)
        start(main, sys.argv[1:])
    except SystemExit as stop:
        exit_now(stop.code)
    exit_now(0)
