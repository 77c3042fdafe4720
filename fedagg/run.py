"""The Hydra edge: compose the config, instantiate the parts, run the federation.

`python -m fedagg.run [group=option ...] [key=value ...]` (add `-m` for a sweep). Only this
module imports Hydra; `train(cfg, run_dir)` runs a composed config and
`run_experiment(overrides, run_dir)` composes and runs one job as the command line does.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import traceback
from collections import Counter
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, HydraException, InstantiationException, MissingConfigException
from hydra.experimental.callback import Callback
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationKeyError

from fedagg.data.partition_report import save_partition_report
from fedagg.loop.assembly import Parts, assemble
from fedagg.loop.checkpoints import load_checkpoint
from fedagg.loop import interrupts, threads
from fedagg.loop.folder import RunFolder, clear_run, held_run
from fedagg.loop.numerics import numerics
from fedagg.loop.round_loop import run_federation
from fedagg.loop.schema import META_KEYS, check_config
from fedagg.data.device import resolve_device
from fedagg.loop.settings import Settings
from fedagg.loop.splits import scaled_rounds
from fedagg.results.groups import GROUPS, RECORDED_CHOICES
from fedagg.tracking.files import write_json

CONF = Path(__file__).resolve().parents[1] / "conf"
LEDGER, LEDGER_ENV = ".jobs", "FEDAGG_SWEEP_LEDGER"  # each job's outcome, for the sweep's summary (SweepSummary)
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
log = logging.getLogger("fedagg")


class SetupError(ValueError):
    """The configuration or the data cannot make a run; the message says which key and why."""


class FolderHeld(SetupError):
    """The run folder holds another run (or one that resume=true cannot continue with this configuration)."""


def settings_from(cfg: DictConfig) -> Settings:
    keys = ("seed", "num_clients", "clients_per_round", "eval_every", "target_acc", "stop_at_target", "checkpoint_every")
    scale = cfg.experiment_scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1:
        raise ValueError(f"experiment_scale={scale!r} is not allowed; it must be a fraction in (0, 1]")
    rounds = scaled_rounds(cfg.rounds, scale) if isinstance(cfg.rounds, int) and cfg.rounds >= 1 else cfg.rounds
    return Settings(rounds=rounds, eval_per_client=cfg.eval.per_client, **{k: cfg[k] for k in keys})


def _user_error(err: Exception) -> Exception | None:
    """The error to show a user (a constructor's own message), or None for a bug."""
    cause = err.__cause__ if isinstance(err, InstantiationException) else err
    return cause if isinstance(cause, (ValueError, FileNotFoundError)) else None


def check_no_ignored_choice(cfg: DictConfig, choices: dict | None) -> None:
    """Refuse a group chosen on the command line that the experiment file replaces.

    A table whose rows or columns are not plain group options sets, e.g.,
    `aggregator: ${table.methods.${method}.aggregator}`: a user's `aggregator=fedavg` would
    then be silently ignored and another cell run. Name the key that picks it instead.
    """
    experiment = (choices or {}).get("experiment")
    for group, chosen in (choices or {}).items():
        parent_path, _, key = group.replace("/", ".").rpartition(".")
        parent = OmegaConf.select(cfg, parent_path) if parent_path else cfg
        if chosen is None or group == "experiment" or not isinstance(parent, DictConfig) or key not in parent:
            continue
        if not OmegaConf.is_interpolation(parent, key):
            continue
        source = str(parent._get_node(key)._value())
        if f"hydra:runtime.choices.{group}" in source:
            continue  # the file maps the chosen option (e.g. model=cnn -> its settings): the choice is used
        pickers = []
        for name in dict.fromkeys(re.findall(r"\$\{(\w+)\}", source)):
            container = re.search(rf"([\w.]+)\.\$\{{{name}\}}", source)
            options = OmegaConf.select(cfg, container.group(1)) if container else None
            allowed = f"; one of {', '.join(map(str, options))}" if isinstance(options, DictConfig) else ""
            pickers.append(f"{name} (now {name}={cfg.get(name)}{allowed})")
        pickers += [f"the {g} chosen (now {g}={choices.get(g)})"
                    for g in dict.fromkeys(re.findall(r"hydra:runtime\.choices\.([\w/]+)", source))]
        raise ValueError(f"{group}={chosen} is ignored by +experiment={experiment}: it sets the {group} from "
                         f"{' and '.join(pickers) or source}; pick the cell with those keys instead")


def _leaves(node, path: str = ""):
    """(dotted key, raw value) of every leaf of a plain container, interpolations unresolved."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif not isinstance(node, list):
        yield path, node


def explain_missing_option(cfg: DictConfig, err: InterpolationKeyError, choices: dict) -> str:
    """One line for an experiment key that picks an option its file does not define
    (`method=nope` makes `${table.methods.${method}...}` point nowhere)."""
    found = re.search(r"Interpolation key '([\w.]+)' not found", str(err))
    if not found:
        return str(err)
    path = found.group(1).split(".")
    for depth in range(len(path) - 1, 0, -1):
        parent = OmegaConf.select(cfg, ".".join(path[:depth]), throw_on_resolution_failure=False)
        if isinstance(parent, DictConfig):
            break
    else:
        return str(err)
    missing, options = path[depth], ", ".join(map(str, parent.keys()))
    # the key holding that value picked it: a top-level one (method=...) before table.* (table.profile=...),
    # then a group chosen on the command line (dataset=cifar10)
    held = [k for k, v in _leaves(OmegaConf.to_container(cfg, resolve=False)) if str(v) == missing and not k.startswith("hydra.")]
    pickers = sorted(held, key=lambda k: k.startswith("table.")) + [g for g, c in choices.items() if str(c) == missing]
    if pickers:
        return f"{pickers[0]}={missing!r} is not allowed here; choose one of {options}"
    return f"{err.full_key} cannot be set: {'.'.join(path[:depth])} has no {missing!r} (it has {options})"


def _read_summary(run_dir: Path) -> dict | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def _changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _changed_keys(a, b, f"{prefix}{k}.")
        elif a != b and f"{prefix}{k}" not in ("resume", "overwrite"):
            keys.append(f"{prefix}{k}")
    return keys


def train(cfg: DictConfig, run_dir: str | Path, choices: dict | None = None, overrides: list[str] | None = None,
          concurrent_jobs: int = 1) -> dict:
    """Run (or resume) one experiment described by a composed config; write its files to run_dir, which no
    other run may use meanwhile. `concurrent_jobs`: how many jobs a launcher runs at once on this machine."""
    run_dir = Path(run_dir)
    try:
        folder = RunFolder(run_dir).acquire()
    except ValueError as err:
        raise SetupError(str(err)) from None
    try:
        return _train(cfg, run_dir, choices or {}, overrides or [], concurrent_jobs)
    finally:
        folder.release()


def _train(cfg: DictConfig, run_dir: Path, choices: dict, overrides: list[str], concurrent_jobs: int) -> dict:
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except InterpolationKeyError as err:
        raise SetupError(explain_missing_option(cfg, err, choices)) from None
    summary_base = {"seed": cfg.seed, "choices": choices, "overrides": overrides, "config": config,
                    "experiment_scale": cfg.experiment_scale}
    if cfg.get("resume") is True and cfg.get("overwrite") is True:
        raise SetupError("resume=true and overwrite=true contradict each other: resume=true continues the run in the "
                         "folder, overwrite=true replaces it; choose one")
    previous = _read_summary(run_dir)
    held = held_run(run_dir)  # read under the folder's lock, before anything is written
    if cfg.resume and previous is not None and previous.get("status") == "completed":
        if changed := _changed_keys(previous.get("config", {}), config):
            raise FolderHeld(f"resume=true but {run_dir} holds a completed run whose configuration differs in "
                             f"{', '.join(changed)}; nothing there was changed: use a new hydra.run.dir")
        log.info("%s already completed; skipping it (resume=true)", run_dir)
        return previous
    with numerics(cfg.deterministic is True, cfg.tf32 is True):  # the values are checked in _prepare, first thing
        try:
            fed, settings, checkpoint = _prepare(cfg, run_dir, choices, config, summary_base, held)
        except KeyboardInterrupt:
            log.warning("stopped before the first round: nothing was computed")
            raise interrupts.StoppedNow from None
        except Exception as err:
            if held is None:  # never touch an earlier run's folder
                write_json(run_dir / "summary.json", dict(summary_base, status="failed",
                                                          error=f"{type(err).__name__}: {err}",
                                                          traceback=traceback.format_exc()))
            if isinstance(err, SetupError):
                raise
            if (user_error := _user_error(err)) is not None:
                raise SetupError(str(user_error)) from err
            raise
        num_params = sum(p.numel() for p in fed.model.parameters())
        log.info("%s: %d train / %d test samples, %d clients, %s with %d parameters on %s", fed.data.name,
                 fed.data.train_y.numel(), fed.data.test_y.numel(), len(fed.clients), type(fed.model).__name__,
                 num_params, summary_base["device"])
        threads.apply(cfg.threads, num_params, concurrent_jobs)
        fed.tracker.start(run_dir, config, name=run_dir.name)
        fed.tracker.log_image("partition", run_dir / "partition.png")
        try:
            summary = run_federation(fed, settings, run_dir, summary_base, checkpoint)
        finally:
            fed.tracker.finish(_read_summary(run_dir) or {"status": "failed"})
    if summary["final_test_acc"] is None:
        log.info("%s after %d rounds, never evaluated (%s)", summary["status"], summary["rounds_completed"], run_dir)
    else:
        log.info("%s: final test accuracy %.4f after %d rounds (%s)", summary["status"], summary["final_test_acc"],
                 summary["rounds_completed"], run_dir)
    return summary


def _prepare(cfg: DictConfig, run_dir: Path, choices: dict, config: dict, summary_base: dict, held: str | None):
    """Everything that can reject the configuration, before any data is loaded; then the folder (`held`: the
    earlier run it holds, if any); then the data, the clients and the model. Returns (federation, settings, the
    checkpoint to resume from or None)."""
    check_no_ignored_choice(cfg, choices)
    check_config(cfg, GROUPS)
    settings = settings_from(cfg)
    device = resolve_device(cfg.device)
    summary_base["device"] = device.type  # the random streams of a run depend on it
    parts = Parts(**{group: instantiate(cfg[group], _convert_="all") for group in GROUPS})  # plain lists and dicts
    if held is not None and cfg.overwrite:
        clear_run(run_dir)
        log.warning("overwrite=true: removed %s from %s", held, run_dir)
    elif held is not None and not cfg.resume:
        raise FolderHeld(f"{run_dir} holds {held}; nothing was changed: continue it with resume=true, keep it with "
                         "another hydra.run.dir or hydra.sweep.dir, or replace it with overwrite=true")
    checkpoint = load_checkpoint(run_dir, device) if cfg.resume else None
    if cfg.resume and checkpoint is None:
        log.info("resume=true but %s has no checkpoint yet: starting from round 1", run_dir)
    if checkpoint is not None and (changed := _changed_keys(checkpoint["summary"]["config"], config)):
        raise FolderHeld(f"resume=true but the configuration differs from the checkpoint's in {', '.join(changed)}; "
                         "resume with the same settings or use a new hydra.run.dir")
    started = checkpoint["summary"].get("device", device.type) if checkpoint is not None else device.type
    if started != device.type:
        raise ValueError(f"resume=true on {device.type}, but the run started on {started}, where its random streams "
                         f"differ: resume it with device={started}, or start a new run")
    fed = assemble(parts, settings, data_root=cfg.data.root, device=device, experiment_scale=cfg.experiment_scale,
                   download=cfg.data.download)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    save_partition_report(fed.partition, run_dir)
    return fed, settings, checkpoint


def run_experiment(overrides: list[str], run_dir: str | Path) -> dict:
    """Compose `overrides` as `python -m fedagg.run OVERRIDES` does (searchpath and experiment files included),
    run that one job in `run_dir` and return its summary. A bad configuration raises `SetupError`."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # `${hydra:runtime.choices...}` in experiment files resolves as on the CLI
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if k in RECORDED_CHOICES}
    with open_dict(cfg):
        del cfg["hydra"]
    return train(cfg, run_dir, choices)


def concurrent_jobs(hydra_cfg) -> int:
    """Jobs the launcher runs at once on this machine: joblib's n_jobs (-1: every core), else one (the basic
    launcher runs them in turn; submitit gives each its own allocation)."""
    launcher = hydra_cfg.launcher
    if hydra_cfg.mode != RunMode.MULTIRUN or "joblib" not in str(launcher.get("_target_", "")).lower():
        return 1
    n = int(launcher.get("n_jobs") or 1)
    return n if n > 0 else max(1, threads.available_cores() + 1 + n)


class SweepSummary(Callback):
    """At the end of a sweep: how many of its jobs completed, diverged, failed or were interrupted, the failed ones'
    folders and errors, and a non-zero exit status when any failed or the sweep was stopped.

    It counts the jobs this sweep launched, not the summary.json files in its folder: a job refused because its
    folder holds another run writes nothing there, and a folder's summary may be an earlier sweep's. Each job
    records its outcome in a ledger of this sweep (`on_job_end` runs where the job runs: in this process, or in a
    joblib worker or a Slurm job, which find the ledger through the environment they inherit).

    Ctrl-C (or SIGTERM) stops a sweep as it stops a run: the running jobs stop after their current round with a
    checkpoint and `status: interrupted`, and the jobs not yet begun do not begin. The signal may reach the whole
    process group (a terminal's Ctrl-C) or this process alone; either way this process passes SIGTERM on to the
    jobs running in joblib's workers, and no process raises a KeyboardInterrupt that would make joblib kill its
    workers mid-write: with joblib, this process blocks the signals and takes them in a thread, and the workers
    it starts inherit the block, so that one waiting for a job ignores them (a job unblocks them while it runs).
    With the basic launcher the jobs run in this process, whose round loop takes the signal."""

    def __init__(self) -> None:
        self.ledger: Path | None = None
        self.stopped = False
        self.previous: dict[int, object] = {}
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {}  # sent to the workers with the jobs: they keep no state of the sweep's process

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    @staticmethod
    def stopping() -> bool:
        """Whether the sweep this job belongs to was stopped (the job should not begin)."""
        ledger = os.environ.get(LEDGER_ENV)
        return bool(ledger) and (Path(ledger) / "stop").exists()

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.ledger = Path(config.hydra.sweep.dir) / LEDGER / f"{os.getpid()}"
        shutil.rmtree(self.ledger, ignore_errors=True)  # a killed sweep's, whose process id this one has now
        self.ledger.mkdir(parents=True)
        os.environ[LEDGER_ENV] = str(self.ledger)
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if threading.current_thread() is not threading.main_thread() or not ("BasicLauncher" in launcher or
                                                                              "joblib" in launcher.lower()):
            return  # jobs elsewhere (Slurm): Ctrl-C leaves this process as it always did
        for sig in STOP_SIGNALS:  # also for a thread started before the block below, which may get the signal
            self.previous[sig] = signal.signal(sig, self._stop)
        if "joblib" in launcher.lower():  # jobs in worker processes of this machine
            # multiprocessing's resource tracker unblocks the signals when it starts: start it first
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # until this process ends
            threading.Thread(target=self._take_signals, name="sweep-signals", daemon=True).start()

    def _take_signals(self) -> None:
        while True:
            self._stop(signal.sigwait(STOP_SIGNALS), None)

    def _stop(self, signum, frame) -> None:
        interrupts.request_stop()  # a job of this process still loading its data stops after one round
        with self.lock:  # the handler and the thread taking the signals
            if self.stopped:
                return
            self.stopped = True
        (self.ledger / "stop").touch()
        log.warning("%s received: stopping the sweep; its running jobs stop after their current round, the others "
                    "do not begin", signal.Signals(signum).name)
        host = socket.gethostname()
        for running in self.ledger.glob("*.running"):
            pid, _, where = running.read_text().strip().partition(" ")
            if where == host and int(pid) != os.getpid():
                try:
                    os.kill(int(pid), signal.SIGTERM)  # stops after its round, like the SIGINT it may have had
                except ProcessLookupError:
                    pass

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        ledger = os.environ.get(LEDGER_ENV)
        if not ledger or not Path(ledger).is_dir():
            return
        interrupts.clear_stop_request()  # one left by the previous job of this process
        if Path(ledger).name != str(os.getpid()) and threading.current_thread() is threading.main_thread():
            # a worker process: a signal while the job loads its data is a stop request, not a KeyboardInterrupt
            for sig in STOP_SIGNALS:
                signal.signal(sig, interrupts.request_stop)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked while the worker waited
        # where the sweep's process sends SIGTERM if it is stopped (after the handlers above are in place)
        (Path(ledger) / f"{config.hydra.job.num}.running").write_text(f"{os.getpid()} {socket.gethostname()}\n")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        ledger = os.environ.get(LEDGER_ENV)
        if not ledger or not Path(ledger).is_dir():
            return
        outcome = job_return._return_value
        if job_return.status != JobStatus.COMPLETED or not isinstance(outcome, dict):
            outcome = {"status": "failed", "error": f"{type(outcome).__name__}: {outcome}"}
        write_json(Path(ledger) / f"{config.hydra.job.num}.json",
                   {"folder": str(config.hydra.runtime.output_dir), **outcome})
        (Path(ledger) / f"{config.hydra.job.num}.running").unlink(missing_ok=True)
        if Path(ledger).name == str(os.getpid()):
            if outcome["status"] == "interrupted":  # this process had the signal, which the job's loop took
                self._stop_quietly(Path(ledger))
        elif threading.current_thread() is threading.main_thread():
            # an idle worker ignores Ctrl-C (raised while it waits, it would break joblib's pool: the sweep's
            # process stops the sweep) and a SIGTERM sent while its job was ending
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def _stop_quietly(self, ledger: Path) -> None:
        self.stopped = True
        (ledger / "stop").touch()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        sweep = Path(config.hydra.sweep.dir)
        ledger = Path(os.environ.pop(LEDGER_ENV, sweep / LEDGER / f"{os.getpid()}"))
        jobs = [json.loads(p.read_text()) for p in sorted(ledger.glob("*.json"), key=lambda p: int(p.stem))]
        shutil.rmtree(ledger, ignore_errors=True)
        try:
            ledger.parent.rmdir()  # the ledgers' folder, unless another sweep into this folder runs now
        except OSError:
            pass
        counts = Counter(job["status"] for job in jobs)
        log.info("sweep %s: %s", sweep, ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no runs")
        failed = [job for job in jobs if job["status"] == "failed"]
        for job in failed:
            error = (str(job.get("error", "")).splitlines() or [""])[0][:600]
            log.error("failed: %s", error if error.startswith(job["folder"]) else f"{job['folder']}: {error}")
        # resume=true finds another configuration's run in a job's folder: the sweep's values differ from the first
        # launch's, and Hydra numbers the folders in the order of the values
        numbered = str(config.hydra.sweep._get_node("subdir")._value()) == "${hydra.job.num}"  # Hydra's default
        if numbered and config.get("resume") is True and any(job.get("folder_held") for job in failed):
            log.error("a sweep numbers its jobs' folders in the order of its values, so one re-launched with other "
                      "values meets other runs there: use another hydra.sweep.dir, or name the folders by their "
                      "values with hydra.sweep.subdir='${hydra.job.override_dirname}'")
        if self.stopped or counts["interrupted"] or counts["not started"]:
            log.warning("stopped: the same command with resume=true finishes the %d interrupted and not started "
                        "job(s)", counts["interrupted"] + counts["not started"])
            sys.exit(130)  # the shell's code for an interrupt
        if failed:
            sys.exit(1)


def _option_line(group: str, value: str, options: list[str]) -> str:
    lowered = {o.lower(): o for o in options}
    close = [lowered[value.lower()]] if value.lower() in lowered else difflib.get_close_matches(value, options, n=1)
    hint = f"; did you mean {group}={close[0]}?" if close else ""
    return f"{group}={value} is not an option{hint} (options: {', '.join(options)})"


def _keys(node, prefix: str = "") -> set[str]:
    """Every key path of a config node, values unresolved (an option's YAML as written)."""
    out = set()
    for key in node.keys() if isinstance(node, DictConfig) else ():
        out.add(f"{prefix}{key}")
        out |= _keys(node._get_node(key), f"{prefix}{key}.")
    return out


def _unknown_key_line(loader, parsed: list, lines: list[str], failing: str, multirun: bool) -> str | None:
    """One line for the override `failing` (of the composed `lines`), whose key the config does not have: which
    options of its group have it, `++key=value` where a sweep sets it before picking the option, else the
    nearest known key."""
    key, value = failing.split("=", 1)
    typed = next((o.input_line for o in parsed if o.key_or_group == key), failing)  # a sweep's values, not one job's
    value = typed.split("=", 1)[1]
    try:  # the config as it would be without that override: the group options it chose
        base = compose(config_name="config", overrides=[line for line in lines if line != failing],
                       return_hydra_config=True)
    except HydraException:
        return None  # another problem first: Hydra names it
    parts = key.split(".")
    groups = [g for g in ("/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)) if loader.repository.group_exists(g)]
    known = {k for k in _keys(base) if not k.startswith("hydra")}
    owners: dict[str, list[str]] = {}  # key path -> the options of its group that have it
    if groups:
        group = groups[0]
        dotted, chosen = group.replace("/", "."), base.hydra.runtime.choices.get(group)
        for option in loader.get_group_options(group):
            loaded = loader.repository.load_config(f"{group}/{option}")
            for k in _keys(loaded.config if loaded is not None else None, f"{dotted}."):
                owners.setdefault(k, []).append(option)
        have, name = owners.get(key, []), key[len(dotted) + 1:]
        swept = next((list(o.sweep_string_iterator()) for o in parsed if o.is_sweep_override()
                      and o.key_or_group == group), None) if multirun else None
        if have and swept and set(swept) <= set(have):
            return (f"{typed} is applied before the sweep picks the {dotted}, to {group}={chosen}, which has no "
                    f"{name}: write ++{typed} to set it in every job")
        if have:
            lacking = [o for o in swept or [chosen] if o not in have]
            return (f"{typed} is not allowed: {group}={', '.join(lacking)} has no {name}; "
                    f"{group}={', '.join(have)} {'has' if len(have) == 1 else 'have'} it")
    parent, _, last = key.rpartition(".")
    tiers = ([k for k in known if k.rpartition(".")[0] == parent],  # the chosen option's keys, then its group's
             [k for k in owners if k.rpartition(".")[0] == parent], sorted(known | set(owners)))
    for tier, cutoff in zip(tiers, (0.6, 0.6, 0.8)):
        lasts = {k.rpartition(".")[2]: k for k in tier if k.rpartition(".")[2] not in META_KEYS}
        if close := difflib.get_close_matches(last, list(lasts), n=1, cutoff=cutoff):
            near = lasts[close[0]]
            break
    else:
        shown = ", ".join(sorted(k.rpartition(".")[2] for k in tiers[0] if k.rpartition(".")[2] not in META_KEYS))
        return (f"{key} is not a setting fedagg knows (known keys{' of ' + parent if parent else ''}: "
                f"{shown or 'none'}); remove it or correct its name")
    where = ""
    if near not in known:
        have = owners[near]
        where = (f" ({groups[0]}={', '.join(have)} {'has' if len(have) == 1 else 'have'} it, "
                 f"{groups[0]}={base.hydra.runtime.choices.get(groups[0])} does not)")
    return f"{key} is not a setting fedagg knows; did you mean {near}={value}?{where}"


def _composition_problem(loader, parsed: list, lines: list[str], multirun: bool) -> str | None:
    """One line for why the overrides `lines` do not compose, or None when they do (or Hydra says it better)."""
    try:
        compose(config_name="config", overrides=lines, return_hydra_config=True)
    except MissingConfigException as err:
        for line in lines:
            group, _, value = line.partition("=")
            if f"{group}/{value}" == err.missing_cfg_file:
                return _option_line(group, value, list(err.options or []))
    except ConfigCompositionException as err:
        if found := re.match(r"Could not append to config. An item is already at '([^']+)'", str(err)):
            line = next((line for line in lines if line.startswith(f"+{found.group(1)}=")), None)
            return None if line is None else f"{line} adds a key the config already has: write {line[1:]} to change it"
        if found := re.match(r"Could not override '([^']+)'", str(err)):
            line = next((line for line in lines if line.startswith(f"{found.group(1)}=")), None)
            return None if line is None else _unknown_key_line(loader, parsed, lines, line, multirun)
    return None


def explain_composition_error(argv: list[str]) -> str | None:
    """One line for a command line Hydra cannot compose because of a mistyped group option or key, or None.

    Hydra's own messages span many lines, suggest no near option, and in a sweep suggest `+key` where
    `++key` is what works. This composes the config as Hydra is about to: a sweep's first config without
    its swept values, then its first job, and checks each swept option of a group. Anything else (flags
    such as --cfg, syntax errors, what only a later job would show) is left to Hydra.
    """
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None
    multirun = any(a in ("-m", "--multirun") for a in argv)
    try:
        parsed = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
    except HydraException:
        return None
    sweeps = [o for o in parsed if multirun and o.is_sweep_override()]
    first = [o.input_line for o in parsed if o not in sweeps]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        if problem := _composition_problem(loader, parsed, first, multirun):
            return problem
        for o in (o for o in sweeps if loader.repository.group_exists(o.key_or_group)):  # composed job by job
            options = loader.get_group_options(o.key_or_group, config_name="config", overrides=first)
            for value in o.sweep_string_iterator():
                if value not in options:
                    return _option_line(o.key_or_group, value, options)
                loaded = loader.repository.load_config(f"{o.key_or_group}/{value}")
                dotted = o.key_or_group.replace("/", ".")
                for add in (a for a in parsed if a.is_add() and a.key_or_group.startswith(f"{dotted}.")):
                    if add.key_or_group in _keys(loaded.config if loaded else None, f"{dotted}."):
                        return (f"{add.input_line} adds a key that {o.key_or_group}={value} already has, which Hydra "
                                f"refuses in that job: write +{add.input_line} to add or set it in every job")
        if sweeps:
            job = first + [f"{o.get_key_element()}={next(o.sweep_string_iterator())}" for o in sweeps]
            return _composition_problem(loader, parsed, job, multirun)
    return None


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict | None:
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.RUN and not str(hydra_cfg.run.dir).strip():
        log.error("hydra.run.dir='' is not allowed: every result file would land in the current folder; give a folder")
        sys.exit(2)
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if k in RECORDED_CHOICES}
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if multirun and SweepSummary.stopping():
        return {"status": "not started"}  # the sweep was stopped before this job began
    try:
        summary = train(cfg, hydra_cfg.runtime.output_dir, choices, list(hydra_cfg.overrides.task),
                        concurrent_jobs(hydra_cfg))
    except KeyboardInterrupt as err:  # Ctrl-C during the setup, or twice
        if not isinstance(err, interrupts.StoppedNow):  # StoppedNow: the run has said how far it got
            log.warning("stopped (Ctrl-C)")
        if multirun:
            return {"status": "interrupted"}
        sys.exit(130)
    except SetupError as err:
        # a user error, not a bug: the message alone, without a traceback
        log.error("%s", err)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            # counted at the sweep's end; the sweep goes on
            return {"status": "failed", "error": str(err), "folder_held": isinstance(err, FolderHeld)}
        sys.exit(2)
    except Exception as err:
        if hydra_cfg.mode != RunMode.MULTIRUN:
            raise  # a single run shows where it broke
        # in a sweep the others go on; the traceback is in the job's summary.json, the count at the sweep's end
        log.error("job failed: %s: %s (traceback in %s)", type(err).__name__, err,
                  Path(hydra_cfg.runtime.output_dir) / "summary.json")
        return {"status": "failed", "error": f"{type(err).__name__}: {err}"}
    if summary["status"] == "interrupted":
        log.warning("interrupted after round %d; resume=true with the same settings continues from its checkpoint",
                    summary["rounds_completed"])
        if not multirun:
            sys.exit(130)  # the shell's code for an interrupt; a sweep says it at its end
    return {"status": summary["status"]}  # for the sweep's count (SweepSummary)


if __name__ == "__main__":
    # Launchers that run jobs in other processes (joblib, submitit) pickle the task: functions of
    # this __main__ copy are pickled by value, which train() cannot be, while fedagg.run's are
    # pickled by name. Rebinding train (and SetupError and FolderHeld, which main() catches) to the
    # importable module's keeps Hydra's config path relative to this file.
    from fedagg.run import FolderHeld, SetupError, SweepSummary, train  # noqa: F401,F811

    if (problem := explain_composition_error(sys.argv[1:])) is not None:
        print(problem, file=sys.stderr)  # before Hydra starts: its multi-line version would follow
        sys.exit(2)
    main()
