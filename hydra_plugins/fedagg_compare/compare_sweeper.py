"""`hydra/sweeper=fedagg_compare`: the fair comparison protocol as a Hydra sweeper (`python -m fedagg.compare`).

Like Hydra's own sweepers it decides which jobs run and hands them, in batches of override lists, to whatever
launcher is configured (basic: one after another; joblib: at once on this machine; submitit_slurm: one Slurm
job each). Every trial and confirm run is an ordinary run of `fedagg.run` in its own folder under the sweep
folder: tune/<method>/t<trial>/s<seed>, confirm/{tuned,default}/<method>/s<seed>. Scores are read back from
those folders' files, so it does not matter where a launcher ran them.
"""


import copy
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from fedagg.edge.compare_keys import CompareSweeperConf, protocol_keys  # noqa: F401  (protocol_keys: the API)
from fedagg.compare.protocol import Protocol, make_protocol, read_rows, score, select, selection_csv, write_atomically
from fedagg.compare.growth import grown, refusal, set_aside_stale
from fedagg.compare.space import default_problem, outside, search_space
from fedagg.loop.splits import scaled_rounds
from hydra_plugins.fedagg_compare.arguments import read_arguments

log = logging.getLogger("fedagg")
METHOD_GROUPS = ("aggregator", "client/objective")  # where a method name is looked up, in this order
LOCAL_LAUNCHERS = ("BasicLauncher", "JoblibLauncher", "StackedLauncher")  # jobs on this machine, with its device


ConfigStore.instance().store(group="hydra/sweeper", name="fedagg_compare", node=CompareSweeperConf, provider="fedagg")


def _studies():
    """fedagg.compare.study, imported when a comparison runs: it brings Optuna and SciPy (most of a second), and
    Hydra imports every plugin at each start, a plain run's too."""
    from fedagg.compare import study

    return study


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _value(v) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


class CompareSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.settings = {k: _plain(v) for k, v in settings.items()}
        self.job_idx = 0

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    # -- before anything runs ------------------------------------------------------------
    def group_options(self) -> dict[str, list[str]]:
        """Each method group's options, the command line's search path (hydra.searchpath, --config-dir) included."""
        loader, hydra = self.hydra_context.config_loader, self.config.hydra
        return {g: loader.get_group_options(g, config_name=hydra.job.config_name, overrides=list(hydra.overrides.hydra))
                for g in METHOD_GROUPS}

    def method(self, name: str, arguments: list[str], options: dict[str, list[str]], fixed: set[str]) -> dict:
        """The overrides that pick a method, its composed config, its search space (the keys in `fixed`, which the
        command line sets, left out) and its client.val_frac."""
        group = next((g for g in METHOD_GROUPS if name in options[g]), None)
        if group is None:
            known = sorted({o for g in METHOD_GROUPS for o in options[g]} - {"none"})
            raise ValueError(f"methods: {name!r} is not an aggregator or a client objective; choose from {', '.join(known)}"
                             f"; a method of your own needs its folder searched: aggregator/{name}.yaml or "
                             f"client/objective/{name}.yaml in DIR and hydra.searchpath=[file://DIR] on the command line")
        picks = [f"{group}={name}"]
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(arguments) + picks)
        except HydraException as err:  # e.g. a key the command line sets that this method's option lacks
            raise ValueError(f"methods: {name}: {str(err).strip().splitlines()[0]}") from None
        nodes = {g: OmegaConf.to_container(cfg[g], resolve=True) for g in ("aggregator", "client")}
        linked = {f"{g}.{k}" for g in ("aggregator", "client") for k in _interpolated(cfg[g])}
        declared = search_space(nodes, linked)
        for p in declared:
            if p.key not in fixed and (problem := default_problem(p)):
                raise ValueError(f"methods: {name}: {p.key}: {problem}, and the method's first trial runs its "
                                 f"defaults; set a number in its config or fix it on the command line ({p.key}=...)")
        return {"picks": picks, "space": [p for p in declared if p.key not in fixed],
                "fixed": [replace(p, fixed=True) for p in declared if p.key in fixed],
                "val_frac": cfg.client.get("val_frac"), "config": cfg}

    def check_runs(self, protocol: Protocol, name: str, method: dict) -> None:
        """Refuse, before anything runs, what the method's trials would refuse: the protocol's own conditions, in
        its keys, then every check a run makes before it loads data, on a tuning run's configuration."""
        cfg = method["config"]
        protocol.check_runs(cfg.get("num_clients"), cfg.get("clients_per_round"), method["val_frac"])
        job = copy.deepcopy(cfg)
        run = {"seed": protocol.tune_seeds[0], "eval.split": "val", **protocol.run_values(method["val_frac"] is not None)}
        for key, value in run.items():
            OmegaConf.update(job, key, value)
        launcher = str(self.config.hydra.launcher.get("_target_", ""))
        # not at the top: python -m fedagg.compare imports this module before it runs fedagg.run as __main__
        from fedagg.edge.job_checks import check_run

        try:
            check_run(job, parts=any(local in launcher for local in LOCAL_LAUNCHERS))
        except ValueError as err:
            raise ValueError(f"{err} (in the runs of method {name})") from None

    def check(self, arguments: list[str]) -> tuple[Protocol, dict, list[str], list[str]]:
        """The protocol, each method's picks and spaces, every run's overrides and the lines to log; a ValueError
        with one line for anything that would stop a run."""
        s = self.settings
        protocol = make_protocol(s["methods"], s["budget"], s["tune_seeds"], s["confirm_seeds"], s["baseline"],
                                 s["val_frac"], s["batch"], s["sampler_seed"], s["validation"], s["held_out"])
        read = read_arguments(list(arguments), s.get("params"), self.config.hydra.runtime.choices.get("experiment"))
        options = self.group_options()
        methods = {m: self.method(m, read.runs, options, read.keys) for m in protocol.methods}
        for m, method in methods.items():
            self.check_runs(protocol, m, method)
        folder = Path(self.config.hydra.sweep.dir)
        record = {"protocol": protocol.as_dict(), "arguments": list(arguments), "design": _studies().DESIGN}
        saved, grew = folder / "protocol.json", []
        if saved.exists():
            before = json.loads(saved.read_text())
            if why := refusal(before, record, folder):
                raise ValueError(why)
            grew = grown(before, record)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(saved, json.dumps(record, indent=2) + "\n")
        return protocol, methods, read.runs, read.notes + grew + [line for m, p in methods.items()
                                                                  for line in _plan(m, p, protocol)]

    # -- the stages ----------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> Any:
        try:
            protocol, methods, arguments, notes = self.check(list(arguments))
        except ValueError as err:
            log.error("%s", err)
            sys.exit(2)
        for line in notes:
            log.info("%s", line)
        folder = Path(self.config.hydra.sweep.dir)
        base = {m: list(arguments) + p["picks"] + protocol.run_keys(p["val_frac"] is not None) for m, p in methods.items()}
        started = time.perf_counter()
        if not self.tune(protocol, methods, base, folder):
            return None
        tuned_s = time.perf_counter() - started
        chosen = self.write_selection(protocol, folder)
        jobs = []
        for m in protocol.methods:
            params = chosen[m]["params"]
            set_aside_stale(folder, m, params)
            for kind, values in (("tuned", params), ("default", {})):
                for s in protocol.confirm_seeds:
                    jobs.append(base[m] + [f"{k}={_value(v)}" for k, v in values.items()] +
                                [f"seed={s}", "eval.split=test", "resume=true",
                                 f"hydra.sweep.subdir=confirm/{kind}/{m}/s{s}"])
        log.info("confirm: %d runs (tuned and default, %d seeds each)", len(jobs), len(protocol.confirm_seeds))
        self.launch(jobs)
        from fedagg.compare.report import write_report  # matplotlib only when it is needed
        write_report(folder, protocol, {m: p["space"] + p["fixed"] for m, p in methods.items()},
                     {"tune (this invocation)": tuned_s, "confirm (this invocation)": time.perf_counter() - started - tuned_s})
        log.info("comparison written: %s, %s", folder / "selection.csv", folder / "report.html")
        return None

    def launch(self, jobs: list[list[str]]):
        returns = self.launcher.launch(jobs, initial_job_idx=self.job_idx)
        self.job_idx += len(jobs)
        return returns

    def tune(self, protocol: Protocol, methods: dict, base: dict, folder: Path) -> bool:
        """Waves of trials, `batch` per method, until every method has its `budget`; False when a trial did not
        finish (interrupted or failed): it stays open and the same command continues it."""
        db = folder / "tuning.db"
        opened = {m: _studies().open_study(db, m) for m in protocol.methods}
        while True:
            wave = []  # (method, trial number, values, run folders)
            for m in protocol.methods:
                space = methods[m]["space"]
                budget = protocol.budget if space else 1  # nothing to tune: more trials would repeat this one
                for number, values in _studies().next_trials(opened[m], space, budget, protocol.batch, protocol.sampler_seed):
                    subdirs = [f"tune/{m}/t{number:03d}/s{s}" for s in protocol.tune_seeds]
                    wave.append((m, number, values, subdirs))
            if not wave:
                return True
            jobs = [base[m] + [f"{k}={_value(v)}" for k, v in values.items()] +
                    [f"seed={s}", "eval.split=val", "resume=true", f"hydra.sweep.subdir={sub}"]
                    for m, _, values, subdirs in wave for s, sub in zip(protocol.tune_seeds, subdirs)]
            log.info("tuning: %d trials (%s)", len(wave), ", ".join(f"{m} #{n}" for m, n, _, _ in wave))
            self.launch(jobs)
            for m, number, values, subdirs in wave:
                scores = [self.trial_score(folder / sub) for sub in subdirs]
                if any(s is None for s in scores):
                    return False
                _studies().tell(opened[m], number, sum(scores) / len(scores))

    @staticmethod
    def trial_score(run_dir: Path) -> float | None:
        path = run_dir / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {"status": "not started"}
        if summary["status"] == "failed":  # the same command would fail alike: the error says what to change
            log.error("tuning stopped: trial %s failed with the error above; once that is fixed, the same command with "
                      "the same hydra.sweep.dir continues the comparison", run_dir)
            return None
        if summary["status"] not in ("completed", "diverged"):
            log.error("trial %s: %s; its trial stays open: the same command with the same hydra.sweep.dir continues "
                      "it", run_dir, summary["status"])
            return None
        config = summary["config"]
        rounds = scaled_rounds(config["rounds"], config.get("experiment_scale", 1.0))
        rows = read_rows(run_dir / "metrics.csv") if (run_dir / "metrics.csv").exists() else []
        return score(rows, rounds, summary["status"])

    def write_selection(self, protocol: Protocol, folder: Path) -> dict:
        rows, chosen = [], {}
        for m in protocol.methods:
            trials = _studies().finished(_studies().open_study(folder / "tuning.db", m))
            chosen[m] = select(trials)
            rows += [{"method": m, **t, "chosen": t is chosen[m]} for t in trials]
        write_atomically(folder / "selection.csv", selection_csv(rows))
        return chosen


def _plan(name: str, method: dict, protocol: Protocol) -> list[str]:
    """The log lines that say how a method's trials are chosen."""
    space, fixed, budget = method["space"], method["fixed"], protocol.budget
    lines = [f"{name}: {p.key}={p.default} is fixed by the command line, not tuned" for p in fixed]
    if not space:
        return lines + [f"{name}: nothing left to tune: one trial (its defaults), not budget={budget} identical ones"]
    lines += [f"{name}: its default {p.key}={p.default:g} lies outside the range [{p.tune.low:g}, {p.tune.high:g}]: "
              "its first trial runs it, the others stay inside" for p in space if outside(p)]
    defaults = ", ".join(f"{p.key}={p.default:g}" for p in space)
    rest = (f", then {budget - 1} point(s) of a scrambled Sobol design in its ranges (sampler_seed="
            f"{protocol.sampler_seed})") if budget > 1 else ""
    return lines + [f"{name}: {len(space)} tuned dimension(s), {budget} trial(s): its defaults ({defaults}){rest}"]


def _interpolated(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for key in node:
        if OmegaConf.is_interpolation(node, key):
            out.append(f"{prefix}{key}")
        elif isinstance(node._get_node(key), DictConfig):
            out += _interpolated(node[key], f"{prefix}{key}.")
    return out
