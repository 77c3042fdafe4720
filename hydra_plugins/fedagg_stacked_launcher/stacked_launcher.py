"""`hydra/launcher=stacked`: a sweep's jobs that can share the device train their rounds together.

It composes every job of the sweep, groups those with the same dataset, model, device, engine options and
local-training shape (batch size, local epochs) - seeds, aggregators and their hyperparameters, partition
parameters, client learning rate, system and attack may differ - and runs each group in this process, in one
thread: it prepares every job of the group in turn (`fedagg.run.prepare`: the job's checks, data, clients, model,
its folder held), then drives their round loops in step (`fedagg.loop.drivers.run_in_step`: each round `begin`
on every job, one parallel-engine computation for all their clients, `end` on each). Jobs that cannot be grouped
run one at a time through Hydra's `run_job`, as with the basic launcher, after one line saying why. Each job keeps
its folder, files, checkpoints, resume and W&B run; a job that fails, diverges or completes leaves its group, the
others go on.

For a group's jobs this launcher does what Hydra's `run_job` does for a job: its folder, `.hydra/` files (unless
`hydra.output_subdir` is null), log file and the sweep's callbacks (`on_job_start`, `on_job_end`: the sweep's
count, `fedagg.edge.sweep.SweepSummary`). HydraConfig holds the job's config while the job is prepared; a job's
log lines go to its own log file (each file takes the lines logged while the launcher works for its job).
Ctrl-C or SIGTERM stops every running job after its round (checkpoint, `status: interrupted`) and starts no
other; a second Ctrl-C stops them at once, as it stops a single run (each keeps its last checkpoint,
`status: interrupted`).
"""


import copy
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import (JobReturn, JobRuntime, JobStatus, _flush_loggers, _save_config, configure_log,
                              env_override, filter_overrides, run_job, setup_globals)
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from fedagg.config.constraints import Range, checked
from fedagg.edge.start_up import SaidOnce
from fedagg.tracking.files import write_json
from hydra_plugins.fedagg_stacked_launcher.console import console_logging, job_log_files, job_table, serving

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
    server = plain.get("server", {}).get("_target_")
    if server and get_class(server).asynchronous:
        return None, ("server=async drives its own event queue on the simulated clock, whose server steps do not "
                      "line up with other runs' rounds")
    engine = plain.get("engine", {}).get("_target_")
    try:
        device = resolve_device(plain.get("device", "auto")).type
    except Exception:
        return None, f"device={plain.get('device')!r} does not resolve here"
    if engine not in (PARALLEL, AUTO):
        choice = cfg.hydra.runtime.choices.get("engine")
        return None, (f"stacked rounds are trained by the parallel engine and this job runs engine={choice} on "
                      f"{device}: add engine=parallel to train it with the others")
    objective = _objective(task)
    if engine == AUTO and objective is not None and not objective.stackable:  # engine=parallel says why it fails
        return None, (f"its client objective {type(objective).__name__} cannot be stacked (stackable = False): "
                      "engine=auto trains it alone")
    for key in ("deterministic", "tf32"):
        if plain.get(key) is True:
            return None, f"{key}=true is a process-wide torch setting"
    if drawn := _dropout(plain.get("model")):
        return None, (f"its model draws dropout masks while it trains ({drawn}), and a stacked call draws them for all "
                      "its runs' clients from one generator: its result would depend on the runs beside it")
    client = plain.get("client", {})
    shared = {"dataset": plain.get("dataset"), "model": plain.get("model"), "device": device,
              "projection_head": _projection_head(objective),  # MOON's head changes the model's structure
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


def _objective(task: DictConfig):
    """The job's client objective (an aggregator's client half or `client/objective`); None when they do not build
    (the job then says why when it runs)."""
    from hydra.utils import instantiate

    try:
        half = instantiate(task.aggregator).needs.client_half
        return half if half is not None else instantiate(task.client.objective)
    except Exception:
        return None


def _projection_head(objective) -> int:
    """The projection head the objective puts under the model's classifier (0: none)."""
    try:
        return int(objective.sees.projection_head)
    except Exception:
        return 0


def trained_stacked(cfg: DictConfig) -> bool:
    """Give an engine=auto job of a group the parallel engine (with its options), as engine=parallel would: the
    user asked for stacked rounds, which only that engine trains. Its config then records the engine that trains
    it. False when the job asked for the parallel engine already (or engine=auto is it, on a GPU)."""
    from fedagg.data.device import resolve_device
    from fedagg.engines.auto import as_parallel

    if cfg.engine.get("_target_") != AUTO or resolve_device(cfg.device).type == "cuda":
        return False
    with read_write(cfg), open_dict(cfg):
        cfg.engine = OmegaConf.create(as_parallel(OmegaConf.to_container(cfg.engine, resolve=True)))
    with read_write(cfg.hydra.runtime.choices):  # summary.json's choices: the option that trains it
        cfg.hydra.runtime.choices.engine = "parallel"
    return True


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


class _Job:
    """A job of a group, as Hydra's `run_job` holds one: its config with the hydra node, the config it runs, what
    it returns to the sweep, its log files; then its prepared run."""

    def __init__(self, config: DictConfig) -> None:
        self.config = config
        self.ret = JobReturn()
        self.handlers: list[logging.Handler] = []
        self.prepared = None  # fedagg.run.Prepared
        self.hydra_view = None  # HydraConfig's view of `config` once its folder is set (`serve_hydra_config`)

    def serve_hydra_config(self) -> None:
        """HydraConfig holds this job's config, as `HydraConfig.set_config(config)` did when its folder was set: the
        view made then, not another copy of the hydra node (a few milliseconds each, several times a job)."""
        if self.hydra_view is None:
            HydraConfig.instance().set_config(self.config)
            self.hydra_view = HydraConfig.instance().cfg
        HydraConfig.instance().cfg = self.hydra_view

    def close_logs(self) -> None:
        for handler in self.handlers:
            logging.getLogger().removeHandler(handler)
            handler.close()
        self.handlers = []


class StackedLauncher(Launcher):
    @checked("hydra.launcher.")
    def __init__(self, max_group: Annotated[int, Range(ge=1, integer=True, words=(
            "it must be an integer >= 1 (the most jobs trained together)"))] = 64) -> None:
        self.max_group = max_group
        self._validated: dict[tuple, DictConfig] = {}
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        self.stopping = self.stopping_now = False
        self.told_auto = False  # the line that engine=auto jobs train with the parallel engine, said once a sweep
        self.start_up = SaidOnce()  # the jobs' start-up lines, said once a sweep (a comparison's waves included)
        self.group = None  # the StopRequests of the group being run (fedagg.runtime.interrupts)

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
        for line in job_table(job_overrides, initial_job_idx):
            log.info("%s", line)
        self._auto_to_parallel([configs[i] for positions, _ in groups if len(positions) > 1 for i in positions])
        returns: list[JobReturn | None] = [None] * len(configs)
        for positions, why in groups:
            if len(positions) == 1:
                i = positions[0]
                log.info("#%d runs alone (%s): %s", configs[i].hydra.job.num, why,
                         " ".join(filter_overrides(job_overrides[i])))
                returns[i] = run_job(hydra_context=self.hydra_context, task_function=self.task_function,
                                     config=configs[i], job_dir_key="hydra.sweep.dir",
                                     job_subdir_key="hydra.sweep.subdir", configure_logging=True)
            else:
                log.info("jobs %s train together", ", ".join(f"#{configs[i].hydra.job.num}" for i in positions))
                saved = HydraConfig.instance().cfg
                try:
                    self._run_group(positions, configs, returns)
                finally:
                    HydraConfig.instance().cfg = saved
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return returns

    def _auto_to_parallel(self, grouped: list[DictConfig]) -> None:
        """The grouped engine=auto jobs train with the parallel engine; one line says so, once a sweep."""
        from fedagg.data.device import resolve_device

        switched = [cfg for cfg in grouped if trained_stacked(cfg)]
        if switched and not self.told_auto:
            self.told_auto = True
            log.info("engine=auto: jobs trained together use the parallel engine (stacking needs it; alone on %s "
                     "engine=auto would run the sequential one), and their config records it",
                     resolve_device(switched[0].device).type)

    def _run_group(self, positions: list[int], configs: list[DictConfig], returns: list) -> None:
        """Prepare every job of the group in turn, then drive their loops in step with one parallel engine; each
        job ends (its files, its W&B run, the sweep's callbacks) as it leaves the group."""
        from fedagg.engines.parallel import ParallelEngine
        from fedagg.loop.drivers import run_alone, run_in_step
        from fedagg.runtime.interrupts import StopRequests

        console_logging(configs[positions[0]].hydra.job_logging, self.start_up)
        self.group = stop = StopRequests()  # the signals come to `_stop`, which sets it
        stop.requested = self.stopping
        try:
            jobs, stepped, alone = [], [], []
            for place, i in enumerate(positions):
                job = _Job(configs[i])
                jobs.append(job)
                try:
                    with stop.writing(last=True):  # a second Ctrl-C stops the group once this is written
                        self._open(job)
                except Exception as err:  # a callback's error, as Hydra's run_job lets it through
                    job.close_logs()
                    returns[positions[place]] = JobReturn(status=JobStatus.FAILED, _return_value=err)
                    continue
                try:
                    with serving(job), self.start_up.preparing():
                        outcome = self._prepare(job)
                except KeyboardInterrupt:  # a second Ctrl-C, outside the run's own setup
                    outcome = {"status": "interrupted"}
                if outcome is not None:
                    self._close(job, outcome, stop)
                    returns[positions[place]] = job.ret
                elif isinstance(job.prepared.loop.fed.engine, ParallelEngine):
                    stepped.append(place)
                else:  # the grouping sends only engine=parallel jobs here; another engine trains its own rounds
                    alone.append(place)
            if stepped:
                # the group's engine: a copy of the first job's before it trained (same options as every job's, its
                # chunk size resolved for the whole group at the first round)
                engine = copy.copy(jobs[stepped[0]].prepared.loop.fed.engine)
                loops = [jobs[place].prepared.loop for place in stepped]
                by_loop = {id(loop): jobs[place] for loop, place in zip(loops, stepped)}

                def left(k: int, outcome) -> None:
                    self._close(jobs[stepped[k]], outcome, stop)
                    returns[positions[stepped[k]]] = jobs[stepped[k]].ret

                began, clock = time.time(), time.perf_counter()
                outcomes = run_in_step(loops, engine, stop, focus=lambda loop: serving(by_loop[id(loop)]), left=left)
                self._record_group([jobs[place] for place in stepped], began, time.perf_counter() - clock)
                for k, outcome in enumerate(outcomes):  # one that a second Ctrl-C kept from `left`
                    if returns[positions[stepped[k]]] is None:
                        left(k, outcome)
            for place in alone:
                job = jobs[place]
                with serving(job):
                    try:
                        outcome = run_alone(job.prepared.loop)
                    except (KeyboardInterrupt, Exception) as err:
                        outcome = err
                self._close(job, outcome, stop)
                returns[positions[place]] = job.ret
        finally:
            self.group = None

    def _record_group(self, jobs: list[_Job], began: float, seconds: float) -> None:
        """The group's wall time, once, in <sweep dir>/stacked_groups.json (each job's wall_time_s is its share):
        its jobs' folders, when its rounds began, how long they took together (the jobs' shares add up to it, but
        the closing of each job as it left)."""
        path = Path(str(self.config.hydra.sweep.dir)) / "stacked_groups.json"
        groups = json.loads(path.read_text()) if path.exists() else []
        sweep_dir = path.parent.resolve()
        folders = [os.path.relpath(job.config.hydra.runtime.output_dir, sweep_dir) for job in jobs]
        groups.append({"jobs": folders, "started_at": round(began, 3), "wall_time_s": round(seconds, 3)})
        write_json(path, groups)

    # -- what Hydra's run_job does for a job, done here for the jobs of a group ---------------------------------
    def _open(self, job: _Job) -> None:
        """The job's folder, its .hydra/ files and log file; the sweep's callbacks hear that it starts."""
        config = job.config
        HydraConfig.instance().set_config(config)  # its sweep subdir may read hydra.job
        output_dir = os.path.join(str(OmegaConf.select(config, "hydra.sweep.dir")),
                                  str(OmegaConf.select(config, "hydra.sweep.subdir")))
        with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
            config.hydra.runtime.output_dir = os.path.abspath(output_dir)
        job.serve_hydra_config()  # the view the job's later steps take again; its config changes no more
        task_cfg = copy.deepcopy(config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        ret = job.ret
        ret.cfg, ret.hydra_cfg = task_cfg, copy.deepcopy(HydraConfig.instance().cfg)
        ret.overrides = OmegaConf.to_container(config.hydra.overrides.task)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        ret.working_dir = os.getcwd()  # the grouping leaves hydra.job.chdir=true jobs alone
        if config.hydra.output_subdir is not None:
            hydra_output = Path(config.hydra.runtime.output_dir) / Path(config.hydra.output_subdir)
            _save_config(task_cfg, "config.yaml", hydra_output)
            _save_config(ret.hydra_cfg, "hydra.yaml", hydra_output)
            _save_config(config.hydra.overrides.task, "overrides.yaml", hydra_output)
        job.handlers = job_log_files(config, job)
        with env_override(ret.hydra_cfg.hydra.job.env_set):
            self.hydra_context.callbacks.on_job_start(config=config, task_function=self.task_function)

    def _prepare(self, job: _Job) -> dict | None:
        """The job's run, ready for its first round (`job.prepared`), or what the job returns at once: it was not
        started (the sweep was stopped), its setup was refused or failed, or it had completed (resume=true)."""
        from fedagg import run
        from fedagg.edge.sweep import SweepSummary

        job.serve_hydra_config()  # experiment files read hydra:runtime.choices
        if self.stopping or SweepSummary.stopping():
            return {"status": "not started"}  # the sweep was stopped before this job began
        run_dir, resume = job.config.hydra.runtime.output_dir, job.ret.cfg.get("resume") is True
        with env_override(job.ret.hydra_cfg.hydra.job.env_set):
            try:
                run_dir, choices, overrides, at_once = run.job_of(HydraConfig.get())
                job.prepared = run.prepare(job.ret.cfg, run_dir, choices, overrides, at_once)
            except (KeyboardInterrupt, Exception) as err:  # in a sweep the others go on
                return run.job_outcome(run_dir, resume, error=err)
        if job.prepared.loop is None:  # resume=true: it had completed
            return run.job_outcome(run_dir, resume, summary=job.prepared.finished(job.prepared.summary))
        return None

    def _close(self, job: _Job, outcome, stop) -> None:
        """The job's end: its run's files and tracker closed, its line, its return, the sweep's callbacks."""
        from fedagg import run

        run_dir = job.config.hydra.runtime.output_dir
        resume = job.ret.cfg.get("resume") is True
        with stop.writing(last=True), serving(job):  # a second Ctrl-C stops the others once the job has ended
            job.serve_hydra_config()
            if job.prepared is not None and job.prepared.loop is not None:
                try:
                    if isinstance(outcome, BaseException):
                        job.prepared.close()
                        outcome = run.job_outcome(run_dir, resume, error=outcome)
                    else:
                        outcome = run.job_outcome(run_dir, resume, summary=job.prepared.finished(outcome))
                except Exception as err:  # closing it failed (its tracker): the job failed, the others go on
                    outcome = run.job_outcome(run_dir, resume, error=err)
            job.ret.return_value, job.ret.status = outcome, JobStatus.COMPLETED
            job.ret.task_name = JobRuntime.instance().get("name")
            _flush_loggers()
            try:
                self.hydra_context.callbacks.on_job_end(config=job.config, job_return=job.ret)
            except Exception as err:  # as Hydra's run_job lets it through: the job failed
                job.ret.return_value, job.ret.status = err, JobStatus.FAILED
            finally:
                job.close_logs()

    def _stop(self, signum, frame) -> None:
        from fedagg.edge.sweep import LEDGER_ENV
        from fedagg.runtime import interrupts

        interrupts.request_stop()  # a job run alone that is loading its data stops after its first round
        if (ledger := os.environ.get(LEDGER_ENV)) and Path(ledger).is_dir():
            (Path(ledger) / "stop").touch()  # jobs not yet begun do not begin
        if not self.stopping:
            self.stopping = True
            if self.group is not None:
                self.group.requested = True
            log.warning("%s received: stopping the sweep; its running jobs stop after their current round, the others "
                        "do not begin (Ctrl-C again to stop them now)", signal.Signals(signum).name)
        elif signum == signal.SIGINT and not self.stopping_now:  # twice, as a single run stops at once
            self.stopping_now = True
            log.warning("SIGINT received again: the running jobs stop now; each keeps its last checkpoint")
            if self.group is not None:
                self.group.now()  # KeyboardInterrupt in the group's round, or once the file being written is
