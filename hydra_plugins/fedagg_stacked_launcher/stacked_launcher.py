"""`hydra/launcher=stacked`: a sweep's jobs that can share the device train their rounds together.

It composes every job of the sweep, groups those with the same dataset, model, device, engine options and
local-training shape (batch size, local epochs) - seeds, aggregators and their hyperparameters, partition
parameters, client learning rate, system and attack may differ - and runs each group in this process, every
job in a thread of its own through its ordinary path (`fedagg.run.main`), their rounds trained as one
parallel-engine computation (`fedagg.stacking`). Jobs that cannot be grouped run one at a time, as with the
basic launcher, after one line saying why. Each job keeps its folder, files, checkpoints and resume; the
sweep's callback (`fedagg.edge.sweep.SweepSummary`) counts them as for any sweep.

Process-wide state is kept per job: Hydra's HydraConfig is one per thread while a group runs, and each job's
log lines go to its own log file (a handler per job that takes its thread's records). Ctrl-C or SIGTERM stops
every running job after its round (checkpoint, `status: interrupted`) and starts no other; a second Ctrl-C stops
them at once, as it stops a single run (each keeps its last checkpoint, `status: interrupted`).
"""


import contextlib
import copy
import json
import logging
import logging.config
import os
import signal
import threading
from pathlib import Path
from typing import Annotated, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from fedagg.config.constraints import Range, checked

log = logging.getLogger("fedagg")


# Its config is conf/hydra/launcher/stacked.yaml alone: a ConfigStore node of the same name made Hydra warn, four
# times a run, that it validates the file against it.
PARALLEL, AUTO = "fedagg.engines.parallel.ParallelEngine", "fedagg.engines.auto.auto_engine"


def group_key(cfg: DictConfig) -> tuple[str | None, str]:
    """(what a job must share with the others of its group, as text; or None and why it runs alone)."""
    from fedagg.data.device import resolve_device

    if cfg.hydra.job.chdir:
        return None, "hydra.job.chdir=true changes the working folder of the whole process"
    saved = HydraConfig.instance().cfg
    try:
        HydraConfig.instance().set_config(cfg)  # experiment files read hydra:runtime.choices
        task = copy.deepcopy(cfg)
        with read_write(task), open_dict(task):
            del task["hydra"]
        plain = OmegaConf.to_container(task, resolve=True)
    except Exception as err:  # the job itself says what is wrong when it runs
        return None, f"its configuration does not resolve ({type(err).__name__})"
    finally:
        HydraConfig.instance().cfg = saved
    engine = plain.get("engine", {}).get("_target_")
    try:
        device = resolve_device(plain.get("device", "auto")).type
    except Exception:
        return None, f"device={plain.get('device')!r} does not resolve here"
    if not (engine == PARALLEL or (engine == AUTO and device == "cuda")):
        choice = cfg.hydra.runtime.choices.get("engine")
        return None, (f"stacked rounds are trained by the parallel engine and this job runs engine={choice} on "
                      f"{device}: add engine=parallel to train it with the others")
    for key in ("deterministic", "tf32"):
        if plain.get(key) is True:
            return None, f"{key}=true is a process-wide torch setting"
    if drawn := _dropout(plain.get("model")):
        return None, (f"its model draws dropout masks while it trains ({drawn}), and a stacked call draws them for all "
                      "its runs' clients from one generator: its result would depend on the runs beside it")
    client = plain.get("client", {})
    shared = {"dataset": plain.get("dataset"), "model": plain.get("model"), "device": device,
              "projection_head": _projection_head(task),  # MOON's head changes the model's structure
              "data": plain.get("data"), "experiment_scale": plain.get("experiment_scale"),
              "engine": {k: v for k, v in plain["engine"].items() if k not in ("_target_", "device")},
              "batch_size": client.get("batch_size"), "local_epochs": client.get("local_epochs")}
    return json.dumps(shared, sort_keys=True, default=str), ""


def _dropout(model: dict | None) -> str:
    """The model's dropout keys that are on, read from its config ('model.dropout_conv=0.25, ...'; '' for none).
    Dropout is the one randomness fedagg's models draw in training (from torch's global generator, which every other
    stream avoids); a model names its rates `dropout*` (models/tff.py), so the config says it before anything is
    built."""
    on = [f"model.{k}={v}" for k, v in (model or {}).items() if "dropout" in str(k) and isinstance(v, (int, float))
          and not isinstance(v, bool) and v > 0]
    return ", ".join(on)


def _projection_head(task: DictConfig) -> int:
    """The projection head the job's client objective puts under the model's classifier (0: none), read from the
    objective itself (an aggregator's client half or `client/objective`); 0 when they do not build (the job then
    says why when it runs)."""
    from hydra.utils import instantiate

    try:
        half = instantiate(task.aggregator).needs.client_half
        objective = half if half is not None else instantiate(task.client.objective)
        return int(objective.sees.projection_head)
    except Exception:
        return 0


def form_groups(keys: list[tuple[str | None, str]], max_group: int) -> list[tuple[list[int], str]]:
    """Positions of the jobs trained together, in the sweep's order (by each group's first job), at most
    `max_group` a group; with why a group of one runs alone."""
    by_key: dict[str, list[int]] = {}
    groups: list[tuple[list[int], str]] = []
    for i, (key, why) in enumerate(keys):
        if key is None:
            groups.append(([i], why))
        else:
            by_key.setdefault(key, []).append(i)
    for members in by_key.values():
        for lo in range(0, len(members), max(1, max_group)):
            groups.append((members[lo:lo + max_group], "no other job of the sweep has its dataset, model, device, "
                                                        "engine options, projection head, batch size and local epochs"))
    return sorted(groups, key=lambda g: g[0][0])


@contextlib.contextmanager
def hydra_config_per_thread():
    """HydraConfig holds one job's config for the whole process; while a group runs, one per thread."""
    instance = HydraConfig.instance()
    cls, main_cfg, local = type(instance), instance.cfg, threading.local()

    class PerThread(cls):
        cfg = property(lambda self: getattr(local, "cfg", main_cfg), lambda self, value: setattr(local, "cfg", value))

    instance.__class__ = PerThread
    try:
        yield
    finally:
        instance.__class__ = cls
        instance.cfg = main_cfg


def console_logging(job_logging: DictConfig) -> None:
    """The jobs' logging without its file handlers (each job adds its own, for its thread: `job_log_file`)."""
    conf = OmegaConf.to_container(job_logging, resolve=False)
    files = [name for name, h in conf.get("handlers", {}).items() if "filename" in h]
    for name in files:
        del conf["handlers"][name]
    if conf.get("root"):
        conf["root"]["handlers"] = [h for h in conf["root"].get("handlers", []) if h not in files]
        logging.config.dictConfig(conf)


@contextlib.contextmanager
def job_log_file():
    """The running job's file handlers of its job_logging (e.g. <run dir>/run.log), taking only this thread's lines."""
    hydra_cfg = HydraConfig.get()
    conf = OmegaConf.to_container(hydra_cfg.job_logging, resolve=True) if hydra_cfg.job_logging else {}
    thread, handlers = threading.get_ident(), []
    for h in conf.get("handlers", {}).values():
        if "filename" not in h:
            continue
        handler = get_class(h.get("class", "logging.FileHandler"))(h["filename"])  # fedagg's RunLog: run_log.py
        fmt = conf.get("formatters", {}).get(h.get("formatter"), {}).get("format")
        handler.setFormatter(logging.Formatter(fmt))
        handler.addFilter(lambda record: record.thread == thread)
        handlers.append(handler)
        logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            logging.getLogger().removeHandler(handler)
            handler.close()


class StackedLauncher(Launcher):
    @checked("hydra.launcher.")
    def __init__(self, max_group: Annotated[int, Range(ge=1, integer=True, words=(
            "it must be an integer >= 1 (the most jobs trained together)"))] = 64) -> None:
        self.max_group = max_group
        self._validated: dict[tuple, DictConfig] = {}
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        self.stopping = False

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        # The sweeper composes every job of a batch to validate it, then hands the batch to the launcher, which
        # composes each again (~0.2 s a job, a third of a small sweep's set-up). The composed configs the
        # validation throws away are kept, and each is taken once by this launcher.
        loader, self._validated = hydra_context.config_loader, {}
        self._compose = compose = loader.load_sweep_config

        def remembered(master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
            cfg = compose(master_config, sweep_overrides)
            self._validated[id(master_config), tuple(sweep_overrides)] = cfg
            return cfg

        loader.load_sweep_config = remembered

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._launch(job_overrides, initial_job_idx)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            from fedagg.runtime import interrupts

            interrupts.stop_all_loops(False)

    def _launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        configs = []
        for i, overrides in enumerate(job_overrides):
            cfg = self._validated.pop((id(self.config), tuple(overrides)), None)
            if cfg is None:
                cfg = self._compose(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.id = cfg.hydra.job.num = initial_job_idx + i
            configs.append(cfg)
        keys = [group_key(cfg) for cfg in configs]
        groups = form_groups(keys, self.max_group)
        log.info("stacked launcher: %d jobs in %d group(s)", len(configs), len(groups))
        returns: list[JobReturn | None] = [None] * len(configs)
        for positions, why in groups:
            if len(positions) == 1:
                i = positions[0]
                log.info("#%d runs alone (%s): %s", configs[i].hydra.job.num, why,
                         " ".join(filter_overrides(job_overrides[i])))
                returns[i] = self._run(configs[i], configure_logging=True)
            else:
                log.info("jobs %s train together", ", ".join(f"#{configs[i].hydra.job.num}" for i in positions))
                self._run_group(positions, configs, returns)
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return returns

    def _run(self, cfg: DictConfig, configure_logging: bool, task_function: TaskFunction | None = None) -> JobReturn:
        return run_job(hydra_context=self.hydra_context, task_function=task_function or self.task_function,
                       config=cfg, job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir",
                       configure_logging=configure_logging)

    def _run_group(self, positions: list[int], configs: list[DictConfig], returns: list) -> None:
        from fedagg import stacking

        coordinator = stacking.Coordinator(len(positions))
        console_logging(configs[positions[0]].hydra.job_logging)

        def task(cfg):
            with job_log_file():
                return self.task_function(cfg)

        def job(place: int, i: int) -> None:
            with stacking.member(coordinator, place):
                try:
                    returns[i] = self._run(configs[i], configure_logging=False, task_function=task)
                except BaseException as err:  # what run_job itself lets through (a callback's error)
                    returns[i] = JobReturn(status=JobStatus.FAILED, _return_value=err)

        with hydra_config_per_thread():
            threads = [threading.Thread(target=job, args=(place, i), name=f"job-{configs[i].hydra.job.num}")
                       for place, i in enumerate(positions)]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():  # in short waits: the signal handler runs in this thread between them
                    t.join(0.2)

    def _stop(self, signum, frame) -> None:
        from fedagg.edge.sweep import LEDGER_ENV
        from fedagg.runtime import interrupts

        interrupts.stop_all_loops()
        interrupts.request_stop()
        if (ledger := os.environ.get(LEDGER_ENV)) and Path(ledger).is_dir():
            (Path(ledger) / "stop").touch()  # jobs not yet begun do not begin
        if not self.stopping:
            self.stopping = True
            log.warning("%s received: stopping the sweep; its running jobs stop after their current round, the others "
                        "do not begin (Ctrl-C again to stop them now)", signal.Signals(signum).name)
        elif signum == signal.SIGINT and not interrupts.stopping_now():  # twice, as a single run stops at once
            interrupts.stop_all_loops_now()
            log.warning("SIGINT received again: the running jobs stop now; each keeps its last checkpoint")
