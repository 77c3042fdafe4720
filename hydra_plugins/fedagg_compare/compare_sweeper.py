"""`hydra/sweeper=fedagg_compare`: the fair comparison protocol as a Hydra sweeper (`python -m fedagg.compare`).

Like Hydra's own sweepers it decides which jobs run and hands them, in batches of override lists, to whatever
launcher is configured (basic: one after another; joblib: at once on this machine; submitit_slurm: one Slurm
job each). Every trial and confirm run is an ordinary run of `fedagg.run` in its own folder under the sweep
folder: tune/<method>/t<trial>/s<seed>, confirm/{tuned,default}/<method>/s<seed>. Scores are read back from
those folders' files, so it does not matter where a launcher ran them.
"""


import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from fedagg.compare import study as studies
from fedagg.compare.protocol import Protocol, make_protocol, read_rows, score, select, selection_csv, write_atomically
from fedagg.compare.space import search_space
from fedagg.loop.splits import scaled_rounds

log = logging.getLogger("fedagg")
METHOD_GROUPS = ("aggregator", "client/objective")  # where a method name is looked up, in this order
OWNED = ("seed", "eval.split", "eval.held_out_clients", "resume", "overwrite", "hydra.sweep.subdir")  # keys the protocol sets for each run


@dataclass
class CompareSweeperConf:
    _target_: str = "hydra_plugins.fedagg_compare.compare_sweeper.CompareSweeper"
    # Any: the protocol checks them itself and says what is wrong in one line
    methods: Any = None
    budget: Any = 16
    tune_seeds: Any = field(default_factory=lambda: [0])
    confirm_seeds: Any = 5
    baseline: Any = None
    val_frac: Any = 0.1
    batch: Any = 1
    sampler_seed: Any = 0
    validation: Any = "split"
    held_out: Any = 0.2


ConfigStore.instance().store(group="hydra/sweeper", name="fedagg_compare", node=CompareSweeperConf, provider="fedagg")


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
    def method(self, name: str, arguments: list[str]) -> dict:
        """The overrides that pick a method, its composed config's search space and its client.val_frac."""
        loader = self.hydra_context.config_loader
        for group in METHOD_GROUPS:
            if name in loader.get_group_options(group):
                picks = [f"{group}={name}"]
                break
        else:
            known = sorted(set(loader.get_group_options("aggregator")) | set(loader.get_group_options("client/objective")))
            raise ValueError(f"methods: {name!r} is not an aggregator or a client objective; choose from "
                             f"{', '.join(k for k in known if k != 'none')}")
        cfg = loader.load_sweep_config(self.config, list(arguments) + picks)
        nodes = {g: OmegaConf.to_container(cfg[g], resolve=True) for g in ("aggregator", "client")}
        linked = {f"{g}.{k}" for g in ("aggregator", "client") for k in _interpolated(cfg[g])}
        return {"picks": picks, "space": search_space(nodes, linked), "val_frac": cfg.client.get("val_frac")}

    def check(self, arguments: list[str]) -> tuple[Protocol, dict]:
        s = self.settings
        protocol = make_protocol(s["methods"], s["budget"], s["tune_seeds"], s["confirm_seeds"], s["baseline"],
                                 s["val_frac"], s["batch"], s["sampler_seed"], s["validation"], s["held_out"])
        for arg in arguments:
            key = arg.split("=", 1)[0].lstrip("+~")
            if key in OWNED:
                raise ValueError(f"{arg} is not allowed here: the protocol sets {key} for each of its runs "
                                 "(seeds: tune_seeds and confirm_seeds; the folder: hydra.sweep.dir)")
        methods = {m: self.method(m, arguments) for m in protocol.methods}
        folder = Path(self.config.hydra.sweep.dir)
        record = {"protocol": protocol.as_dict(), "arguments": list(arguments)}
        saved = folder / "protocol.json"
        if saved.exists() and json.loads(saved.read_text()) != record:
            raise ValueError(f"hydra.sweep.dir={folder} holds a comparison with other settings (protocol.json); "
                             "nothing was changed: rerun it with the same command, or give another hydra.sweep.dir")
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(saved, json.dumps(record, indent=2) + "\n")
        return protocol, methods

    # -- the stages ----------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> Any:
        try:
            protocol, methods = self.check(list(arguments))
        except ValueError as err:
            log.error("%s", err)
            sys.exit(2)
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
            for kind, values in (("tuned", params), ("default", {})):
                for s in protocol.confirm_seeds:
                    jobs.append(base[m] + [f"{k}={_value(v)}" for k, v in values.items()] +
                                [f"seed={s}", "eval.split=test", "resume=true",
                                 f"hydra.sweep.subdir=confirm/{kind}/{m}/s{s}"])
        log.info("confirm: %d runs (tuned and default, %d seeds each)", len(jobs), len(protocol.confirm_seeds))
        self.launch(jobs)
        from fedagg.compare.report import write_report  # matplotlib only when it is needed
        write_report(folder, protocol, {m: p["space"] for m, p in methods.items()},
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
        opened = {m: studies.open_study(db, m) for m in protocol.methods}
        while True:
            wave = []  # (method, trial number, values, run folders)
            for m in protocol.methods:
                for number, values in studies.next_trials(opened[m], methods[m]["space"], protocol.budget,
                                                          protocol.batch, protocol.sampler_seed):
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
                studies.tell(opened[m], number, sum(scores) / len(scores))

    @staticmethod
    def trial_score(run_dir: Path) -> float | None:
        path = run_dir / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {"status": "not started"}
        if summary["status"] not in ("completed", "diverged"):
            log.error("trial %s: %s; its trial stays open: run the same command again to continue",
                      run_dir, summary["status"])
            return None
        config = summary["config"]
        rounds = scaled_rounds(config["rounds"], config.get("experiment_scale", 1.0))
        rows = read_rows(run_dir / "metrics.csv") if (run_dir / "metrics.csv").exists() else []
        return score(rows, rounds, summary["status"])

    def write_selection(self, protocol: Protocol, folder: Path) -> dict:
        rows, chosen = [], {}
        for m in protocol.methods:
            trials = studies.finished(studies.open_study(folder / "tuning.db", m))
            chosen[m] = select(trials)
            rows += [{"method": m, **t, "chosen": t is chosen[m]} for t in trials]
        write_atomically(folder / "selection.csv", selection_csv(rows))
        return chosen


def _interpolated(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for key in node:
        if OmegaConf.is_interpolation(node, key):
            out.append(f"{prefix}{key}")
        elif isinstance(node._get_node(key), DictConfig):
            out += _interpolated(node[key], f"{prefix}{key}.")
    return out
