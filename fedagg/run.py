"""The Hydra edge: compose the config, instantiate the parts, run the federation.

`python -m fedagg.run [group=option ...] [key=value ...]` (add `-m` for a sweep). Only this
module and `fedagg/edge` (command-line messages, the sweep's callback) import Hydra;
`train(cfg, run_dir)` runs a composed config and
`run_experiment(overrides, run_dir)` composes and runs one job as the command line does.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import re
import sys
import traceback
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import InterpolationKeyError

from fedagg.data.partition_report import drawn, save_partition_report
from fedagg.edge import CONF
from fedagg.edge import run_log
from fedagg.edge.channel_choice import channel_choice, uniform_mean_for_privacy
from fedagg.edge.command_line import explain_composition_error, in_user_words
from fedagg.edge.default_model import with_default_model
from fedagg.edge.sweep import SweepSummary, concurrent_jobs
from fedagg.loop.assembly import Parts, assemble, connect
from fedagg.loop.checkpoints import load_checkpoint
from fedagg.loop import interrupts, threads
from fedagg.loop.folder import RunFolder, clear_run, held_run, held_sweep
from fedagg.loop.numerics import numerics
from fedagg.loop.round_loop import run_federation
from fedagg.config.names import DISPLAY_NAME
from fedagg.loop.schema import check_config
from fedagg.data.device import resolve_device
from fedagg.loop.settings import Settings
from fedagg.loop.splits import scaled_rounds
from fedagg import stacking
from fedagg.results.groups import GROUPS, RECORDED_CHOICES, method_name_of, method_of
from fedagg.tracking.files import write_json

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
    return Settings(rounds=rounds, eval_per_client=cfg.eval.per_client, eval_split=cfg.eval.split,
                    held_out=cfg.eval.held_out_clients, **{k: cfg[k] for k in keys})


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
        elif a != b and f"{prefix}{k}" not in ("resume", "overwrite") and k != DISPLAY_NAME:  # a name computes nothing
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
    except SetupError as err:  # a number in the message as the user typed it (1e300, not 1e+300)
        if (words := in_user_words(str(err), overrides or [])) != str(err):
            raise type(err)(words) from err
        raise
    finally:
        folder.release()


def _train(cfg: DictConfig, run_dir: Path, choices: dict, overrides: list[str], concurrent_jobs: int) -> dict:
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
    summary_base = {"seed": cfg.seed, "method": method_of(choices, config), "method_name": method_name_of(choices, config),
                    "choices": choices, "overrides": overrides, "config": config, "experiment_scale": cfg.experiment_scale}
    if cfg.get("resume") is True and cfg.get("overwrite") is True:
        raise SetupError("resume=true and overwrite=true contradict each other: resume=true continues the run in the "
                         "folder, overwrite=true replaces it; choose one")
    previous = _read_summary(run_dir)
    held = held_run(run_dir)  # read under the folder's lock, before anything is written
    if held is None:
        run_log.claim(run_dir, fresh=True)  # nothing of another run is there: the folder is this run's
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
        # the default backbone's reason joins this line, after the setup: a configuration error stays one line;
        # the training samples are the clients' (experiment_scale shrinks them as it shrinks the test set)
        log.info("%s: %d train / %d test samples, %d clients, %s with %d parameters on %s%s", fed.data.name,
                 fed.partition["total"], fed.data.test_y.numel(), len(fed.clients), type(fed.model).__name__,
                 num_params, summary_base["device"], f" ({model_note})" if model_note else "")
        for note in [weighting_note, *fed.channel.notes()]:
            if note:
                log.info("%s", note)
        threads.apply(cfg.threads, num_params, concurrent_jobs)
        fed.tracker.start(run_dir, config, name=run_dir.name)
        fed.tracker.log_image("partition", run_dir / "partition.png")
        try:
            summary = run_federation(fed, settings, run_dir, summary_base, checkpoint)
        finally:
            drawn()  # partition.png, drawn while the first rounds ran
            fed.tracker.finish(_read_summary(run_dir) or {"status": "failed"})
    if summary["final_test_acc"] is None and summary.get("final_val_acc") is not None:  # eval.split=val
        log.info("%s: final validation accuracy %.4f after %d rounds (%s)", summary["status"], summary["final_val_acc"],
                 summary["rounds_completed"], run_dir)
    elif summary["final_test_acc"] is None:
        log.info("%s after %d rounds, never evaluated (%s)", summary["status"], summary["rounds_completed"], run_dir)
    else:
        log.info("%s: final test accuracy %.4f after %d rounds (%s)", summary["status"], summary["final_test_acc"],
                 summary["rounds_completed"], run_dir)
    return summary


def _checked(cfg: DictConfig, choices: dict) -> Settings:
    """The checks of a configuration that need neither its parts nor the device: keys, types, ranges, settings."""
    check_no_ignored_choice(cfg, choices)
    check_config(cfg, GROUPS)
    return settings_from(cfg)


def _parts(cfg: DictConfig, choices: dict) -> Parts:
    parts = Parts(**{group: instantiate(cfg[group], _convert_="all") for group in GROUPS},  # plain lists and dicts
                  noise=cfg.partition.get("noise", 0.0), choices=choices)
    if "noise" in parts.partition.keywords:  # read by the run, which adds it to the images, not by the split
        parts.partition = functools.partial(parts.partition.func, *parts.partition.args,
                                            **{k: v for k, v in parts.partition.keywords.items() if k != "noise"})
    return parts


def check_run(cfg: DictConfig, parts: bool = True) -> None:
    """Refuse (SetupError, one line) a job's configuration, composed with its `hydra` node, that its run would
    refuse before loading any data: the checks a run makes first and, with `parts`, those of its instantiated parts
    wired together (`connect`: a method and the client or engine it cannot run with, a validation split that holds
    nothing out). For a caller that launches runs later and must not find out at the first one (fedagg.compare).
    `parts=False` where the runs go to other machines: an engine's choice and checks follow the device there."""
    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    hydra_config.set_config(cfg)  # `${hydra:runtime.choices...}` in experiment files resolves as in the job
    try:
        choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if k in RECORDED_CHOICES}
        overrides = list(cfg.hydra.overrides.task)
        cfg = copy.deepcopy(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        cfg, _ = with_default_model(cfg, choices)
        cfg, _ = uniform_mean_for_privacy(cfg, overrides)  # as the job will run it
        OmegaConf.to_container(cfg, resolve=True)
        settings = _checked(cfg, choices)
        if parts and settings.num_clients is not None:  # else known only once the data is loaded
            connect(_parts(cfg, choices), settings)
    except SetupError:
        raise
    except InterpolationKeyError as err:
        raise SetupError(explain_missing_option(cfg, err, choices)) from None
    except Exception as err:
        if (user_error := _user_error(err)) is not None:
            raise SetupError(str(user_error)) from None
        raise
    finally:
        hydra_config.cfg = previous


def _prepare(cfg: DictConfig, run_dir: Path, choices: dict, config: dict, summary_base: dict, held: str | None):
    """Everything that can reject the configuration, before any data is loaded; then the folder (`held`: the
    earlier run it holds, if any); then the data, the clients and the model. Returns (federation, settings, the
    checkpoint to resume from or None)."""
    settings = _checked(cfg, choices)
    device = resolve_device(cfg.device)
    summary_base["device"] = device.type  # the random streams of a run depend on it
    parts = _parts(cfg, choices)
    parts.engine = stacking.engine_for(parts.engine)  # in a stacked sweep's group: rounds trained together
    if held is not None and cfg.overwrite:
        clear_run(run_dir)
        run_log.claim(run_dir, fresh=True)  # the replaced run's log goes with it
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
    run_log.claim(run_dir, fresh=False)  # resumed: its log goes on (claimed already when the folder held nothing)
    fed = assemble(parts, settings, data_root=cfg.data.root, device=device, experiment_scale=cfg.experiment_scale,
                   download=cfg.data.download)
    settings = fed.settings  # num_clients=null is now the dataset's number of clients
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
    return train(cfg, run_dir, choices, list(overrides))


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
        log.warning("interrupted after round %d; %s continues from its checkpoint", summary["rounds_completed"],
                    "the same command" if cfg.resume else "resume=true with the same settings")
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
