"""python -m fedagg.compare's command line: Hydra's options anywhere, --help, the user's own methods, experiment
files, keys fixed on the command line, and every refusal in one line before anything runs (the sweeper's checks,
in this process); end to end on the bundled digits: a comparison killed (SIGKILL) in the middle of a trial and run
again ends as one run straight through, and one stopped with Ctrl-C says how to continue."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.types import HydraContext
from omegaconf import OmegaConf
from scipy.stats import qmc

from conftest import CONF, ROOT, SHARED_DATA, needs_mnist
from fedagg.compare.report import chosen_table
from fedagg.edge import compare_line
from fedagg.edge.compare_line import translate
from hydra_plugins.fedagg_compare import compare_sweeper
from hydra_plugins.fedagg_compare.arguments import read_arguments
from hydra_plugins.fedagg_compare.compare_sweeper import CompareSweeper

LR = (1e-3, 10 ** 0.5, True)  # the client rate's one range
MEDIAN_NORM = '''"""A sample-weighted mean that down-weights clients whose update is far longer than the round's median."""
from typing import Annotated

import torch

from fedagg import Aggregator, Range, RoundInputs, Tune, checked


class MedianNorm(Aggregator):
    @checked("aggregator.")
    def __init__(self, tolerance: Annotated[float, Range(gt=0), Tune(1.0, 10.0, log=True, source="1x to 10x")] = 2.0):
        super().__init__()
        self.tolerance = tolerance

    def client_weights(self, inputs: RoundInputs) -> torch.Tensor:
        norms = (inputs.client_params - inputs.global_params).norm(dim=1)  # [K]
        cap = torch.clamp(self.tolerance * norms.median() / norms.clamp_min(1e-12), max=1.0)
        score = inputs.num_samples.float() * cap  # a client beyond tolerance x the median counts less
        return score / score.sum()
'''


@pytest.fixture
def own_folder(tmp_path, monkeypatch):
    """A researcher's folder outside the package: the rule's module and its config group option."""
    folder = tmp_path / "mine"
    (folder / "my_rules").mkdir(parents=True)
    (folder / "my_rules" / "median_norm.py").write_text(MEDIAN_NORM)
    (folder / "my_conf" / "aggregator").mkdir(parents=True)
    (folder / "my_conf" / "aggregator" / "median_norm.yaml").write_text(
        "_target_: my_rules.median_norm.MedianNorm\ntolerance: 2.0\n")
    monkeypatch.syspath_prepend(str(folder))
    return folder


def checked(folder, *argv):
    """The sweeper's checks of `python -m fedagg.compare ARGV hydra.sweep.dir=FOLDER`, in this process: (protocol,
    methods, every run's overrides, the lines it logs), or the ValueError whose line it prints before exiting."""
    overrides = [a for a in translate([*argv, f"hydra.sweep.dir={folder}"]) if not a.startswith("-")]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        settings = OmegaConf.to_container(cfg.hydra.sweeper)
        del settings["_target_"]
        sweeper = CompareSweeper(**settings)
        sweeper.setup(hydra_context=HydraContext(GlobalHydra.instance().config_loader(), Callbacks(cfg)),
                      task_function=lambda c: None, config=cfg)
        return sweeper.check(list(cfg.hydra.overrides.task))


def refusal(folder, *argv):
    with pytest.raises(ValueError) as err:
        checked(folder, *argv)
    assert not (folder / "protocol.json").exists()  # nothing was written, nothing ran
    return str(err.value)


def spaces(methods):
    return {m: {p.key: (p.tune.low, p.tune.high, p.tune.log) for p in info["space"]} for m, info in methods.items()}


# -- the command line ----------------------------------------------------------------
OVERRIDES = ["hydra.sweeper.methods=[fedavg,fedprox]", "rounds=2", "hydra.sweeper.budget=3", "device=cpu"]


@pytest.mark.parametrize("option", [
    ["--config-dir", "my_conf"], ["-cd", "my_conf"], ["--config-dir=my_conf"], ["--config-path", "conf"],
    ["-cp", "conf"], ["--config-name", "config"], ["-cn", "config"], ["--cfg", "job"], ["-c", "all"],
    ["--cfg", "job", "--resolve"], ["--cfg", "job", "--package", "client"], ["--cfg", "job", "-p", "client"],
    ["--info"], ["--info", "searchpath"], ["-i", "defaults"], ["--hydra-help"], ["-m"]])
def test_hydra_options_and_their_values_may_stand_anywhere(option):
    argv = ["methods=[fedavg,fedprox]", "rounds=2", *option, "budget=3", "device=cpu", "hydra.sweep.dir=out"]
    line = translate(argv)
    # Hydra takes one mode: with --cfg or --info the comparison is shown, not run (no -m); a -m given is not doubled
    shown = any(o in ("--cfg", "-c", "--info", "-i", "-m") for o in option)
    given = ["--info=all"] if option == ["--info"] else option  # a bare --info: Hydra's own default, written out
    assert line == [*([] if shown else ["-m"]), *given, "hydra/sweeper=fedagg_compare", *OVERRIDES, "hydra.sweep.dir=out"]
    parsed = get_args_parser().parse_args(line)  # Hydra's own parser takes every override
    assert parsed.overrides == ["hydra/sweeper=fedagg_compare", *OVERRIDES, "hydra.sweep.dir=out"]


def test_help_lists_the_protocol_keys_with_the_sweepers_defaults(capsys, monkeypatch):
    fields = compare_sweeper.CompareSweeperConf.__dataclass_fields__
    monkeypatch.setattr(fields["budget"], "default", 24)  # one place: the help follows the sweeper's config
    compare_line.main(["rounds=3", "--help"])
    out = capsys.readouterr().out
    keys = [line.split()[0] for line in out.splitlines() if re.match(r"  \w+=", line)]
    assert keys == ["methods=null", "budget=24", "tune_seeds=[0]", "confirm_seeds=5", "baseline=null", "val_frac=0.1",
                    "batch=1", "sampler_seed=0", "validation=split", "held_out=0.2"]
    assert "  budget=24         trials per method, exactly (one when the command line fixes all it would tune)" in out
    assert ("Every other argument is a run override, as for python -m fedagg.run" in out
            and "`python -m fedagg.run --help` lists the groups and their options" in out)


# -- your own methods ----------------------------------------------------------------
def test_an_own_method_is_compared_through_the_command_lines_searchpath(tmp_path, own_folder):
    searchpath = f"hydra.searchpath=[file://{own_folder / 'my_conf'}]"
    _, methods, _, notes = checked(tmp_path / "a", "methods=[fedavg,median_norm]", searchpath, "budget=4")
    assert spaces(methods) == {"fedavg": {"client.lr": LR},
                               "median_norm": {"aggregator.tolerance": (1.0, 10.0, True), "client.lr": LR}}
    assert methods["median_norm"]["picks"] == ["aggregator=median_norm"]
    assert notes[-1] == ("median_norm: 2 tuned dimension(s), 4 trial(s): its defaults (aggregator.tolerance=2, "
                         "client.lr=0.05), then 3 point(s) of a scrambled Sobol design in its ranges (sampler_seed=0)")
    line = refusal(tmp_path / "b", "methods=[fedavg,median_nrom]", searchpath)  # the list names the user's own
    assert line.startswith("methods: 'median_nrom' is not an aggregator or a client objective; choose from abavg,")
    assert ", median, median_norm, moon, multikrum," in line
    line = refusal(tmp_path / "c", "methods=[fedavg,median_norm]")  # without the searchpath: not known
    assert line.startswith("methods: 'median_norm' is not an aggregator") and "median_norm," not in line


# -- experiment files ----------------------------------------------------------------
def test_an_experiment_files_sweep_is_refused_unless_fixed_and_its_methods_and_seeds_are_ignored(tmp_path):
    # conf/experiment/comparison_mnist.yaml: params model: mlp,cnn_small; aggregator: fedavg,...; seed: 0,1,2
    assert refusal(tmp_path / "a", "methods=[fedavg,fedprox]", "+experiment=comparison_mnist") == (
        "+experiment=comparison_mnist sweeps model over mlp, cnn_small: the comparison runs one setting; fix one on "
        "the command line, e.g. model=mlp")
    _, methods, runs, notes = checked(tmp_path / "b", "methods=[fedavg,fedprox]", "+experiment=comparison_mnist",
                                      "model=cnn_small")
    assert runs == ["+experiment=comparison_mnist", "model=cnn_small"]
    assert notes[0] == ("+experiment=comparison_mnist sweeps aggregator, seed: ignored, the comparison chooses the "
                        "methods (methods) and the seeds (tune_seeds, confirm_seeds) itself")
    for m, objective in (("fedavg", "none"), ("fedprox", "fedprox")):  # the file's settings, the command line's model
        choices = methods[m]["config"].hydra.runtime.choices
        assert (choices["model"], choices["dataset"], choices["partition"], choices["client/objective"]) == \
               ("cnn_small", "mnist", "shards", objective)
        cfg = methods[m]["config"]
        assert (cfg.rounds, cfg.num_clients, cfg.clients_per_round, cfg.client.lr, cfg.client.local_epochs) == \
               (50, 100, 10, 0.01, 10)


def test_an_experiments_single_values_apply_and_the_command_line_wins():
    read = read_arguments(["model=mlp", "rounds=3"], {"model": "mlp,cnn_small", "partition.alpha": "0.3",
                                                      "seed": "0,1,2", "client/objective": "none,fedprox"}, "mine")
    assert read.runs == ["partition.alpha=0.3", "model=mlp", "rounds=3"] and read.keys == {"model", "rounds"}
    assert read.notes == ["+experiment=mine sweeps seed, client/objective: ignored, the comparison chooses the "
                          "methods (methods) and the seeds (tune_seeds, confirm_seeds) itself"]
    with pytest.raises(ValueError) as err:
        read_arguments([], {"partition.alpha": "0.1,0.5"}, None)
    assert str(err.value) == ("hydra.sweeper.params sweeps partition.alpha over 0.1, 0.5: the comparison runs one "
                              "setting; fix one on the command line, e.g. partition.alpha=0.1")
    with pytest.raises(ValueError) as err:  # a sweep on the command line itself
        read_arguments(["partition.alpha=0.1,0.5"], None, None)
    assert str(err.value) == ("partition.alpha=0.1,0.5 sweeps partition.alpha over 0.1, 0.5: the comparison runs one "
                              "setting; fix one on the command line, e.g. partition.alpha=0.1")


# -- refusals before the first trial ---------------------------------------------------
@pytest.mark.parametrize("argv, line", [
    (["validation=clients", "held_out=0.95"],
     "held_out=0.95 is not allowed with num_clients=10: it holds out all 10 clients and leaves none to train; give a "
     "smaller share, e.g. held_out=0.2"),
    (["validation=clients", "held_out=0.5", "clients_per_round=6"],
     "held_out=0.5 is not allowed with clients_per_round=6: it leaves 5 of the 10 clients to train, fewer than a "
     "round takes; give a smaller held_out or clients_per_round"),
    (["client.val_frac=0"],
     "client.val_frac=0 is not allowed here: trials are scored on each client's validation split, and it holds none "
     "out; leave client.val_frac out (the comparison then holds out val_frac=0.1), or score on held-out clients with "
     "validation=clients"),
    # fedagg's own checks of a run, made before the first one: a run would refuse these after loading its data
    (["client.val_frac=0.5", "client.test_frac=0.6", "eval.per_client=true"],
     "client.val_frac=0.5 and client.test_frac=0.6 are not allowed together: they hold out 110% of each client's "
     "data and leave nothing to train on; their sum must be below 1 (in the runs of method fedavg)"),
    (["rounds=0"], "rounds=0 is not allowed; it must be an integer >= 1 (in the runs of method fedavg)"),
])
def test_what_a_trial_would_refuse_is_one_line_before_anything_runs(tmp_path, argv, line):
    assert refusal(tmp_path, "methods=[fedavg,fedprox]", *argv) == line


def test_what_a_run_adapts_before_its_checks_the_comparisons_check_adapts_too(tmp_path):
    # channel=dp takes the uniform mean when the weighting is left to FedAvg's default: a run does, so must the check
    _, methods, runs, _ = checked(tmp_path, "methods=[fedavg,fedadam]", "channel=dp", "budget=1")
    assert set(methods) == {"fedavg", "fedadam"} and "channel=dp" in runs
    assert refusal(tmp_path / "other", "methods=[fedavg]", "channel=dp", "aggregator.weighting=samples") == (
        "aggregator.weighting=samples is not allowed with channel=dp: the noise is scaled for the uniform mean; "
        "set aggregator.weighting=uniform (in the runs of method fedavg)")


# -- a tuned key set on the command line -------------------------------------------------
def test_a_tuned_key_set_on_the_command_line_is_fixed(tmp_path):
    _, methods, runs, notes = checked(tmp_path, "methods=[fedavg,fedprox]", "client.lr=0.1", "budget=4")
    assert spaces(methods) == {"fedavg": {}, "fedprox": {"client.objective.mu": (1e-3, 1.0, True)}}
    assert [(p.key, p.default, p.fixed) for p in methods["fedprox"]["fixed"]] == [("client.lr", 0.1, True)]
    assert "client.lr=0.1" in runs  # every run of every method takes it
    assert notes == ["fedavg: client.lr=0.1 is fixed by the command line, not tuned",
                     "fedavg: nothing left to tune: one trial (its defaults), not budget=4 identical ones",
                     "fedprox: client.lr=0.1 is fixed by the command line, not tuned",
                     "fedprox: 1 tuned dimension(s), 4 trial(s): its defaults (client.objective.mu=0.01), then 3 "
                     "point(s) of a scrambled Sobol design in its ranges (sampler_seed=0)"]
    selection = [{"method": "fedprox", "trial": 0, "params": {"client.objective.mu": 0.01}, "chosen": True}]
    table = chosen_table(selection, {"fedprox": methods["fedprox"]["space"] + methods["fedprox"]["fixed"]}).grid
    assert list(table["setting"]) == ["client.objective.mu", "client.lr"]
    assert list(table["default"]) == ["0.01", "0.1"] and list(table["chosen"]) == ["0.01", "fixed by the command line"]

SMALL = ["methods=[fedavg,fedprox]", "budget=2", "confirm_seeds=1", "rounds=10", "checkpoint_every=1", "device=cpu"]


def compare(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "fedagg.compare", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), **kwargs)


@pytest.mark.slow  # a subprocess (3-12 s); the refusals themselves are unit-tested in test_compare.py
def test_an_unknown_method_is_one_line_and_nothing_runs(tmp_path):
    proc = compare("methods=[fedavg,fedbogus]", f"hydra.sweep.dir={tmp_path}")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out
    assert re.sub(r"^\[[^]]*\]\[[^]]*\]\s*(- )?", "", lines[0]).startswith(  # after the logger's time and name
        "methods: 'fedbogus' is not an aggregator or a client objective; choose from abavg, acc_inverse,")
    assert not (tmp_path / "tune").exists() and not (tmp_path / "tuning.db").exists()


def selection(folder):
    with open(folder / "selection.csv", newline="") as f:
        return list(csv.DictReader(f))


def confirm_results(folder):
    return {p.parent.relative_to(folder).as_posix(): json.loads(p.read_text())["final_test_acc"]
            for p in sorted((folder / "confirm").rglob("summary.json"))}


@pytest.mark.slow
def test_a_comparison_killed_mid_trial_and_run_again_equals_one_run_straight_through(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    proc = compare(*SMALL, f"hydra.sweep.dir={straight}")
    assert proc.wait(timeout=600) == 0, proc.stdout.read()[-3000:]

    victim = killed / "tune" / "fedprox" / "t000" / "s0"  # the second trial to run
    proc = compare(*SMALL, f"hydra.sweep.dir={killed}", start_new_session=True)
    deadline = time.time() + 300
    while not (victim / "checkpoint.pt").exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    summary = victim / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["status"] == "running"  # killed mid-trial
    proc = compare(*SMALL, f"hydra.sweep.dir={killed}")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert "resuming after round" in out  # the killed trial went on from its checkpoint

    a, b = selection(straight), selection(killed)
    assert [(r["method"], r["trial"], r["params"], r["chosen"]) for r in a] == \
           [(r["method"], r["trial"], r["params"], r["chosen"]) for r in b]
    assert [r["method"] for r in a] == ["fedavg", "fedavg", "fedprox", "fedprox"]  # exactly the budget each
    for x, y in zip(a, b):
        assert float(x["val_score"]) == pytest.approx(float(y["val_score"]), abs=1e-6)
    ra, rb = confirm_results(straight), confirm_results(killed)
    assert list(ra) == ["confirm/default/fedavg/s1", "confirm/default/fedprox/s1",
                        "confirm/tuned/fedavg/s1", "confirm/tuned/fedprox/s1"]  # seed 1: not the tuning seed 0
    assert list(rb) == list(ra) and all(rb[k] == pytest.approx(ra[k], abs=1e-6) for k in ra)
    for trial in (killed / "tune").rglob("metrics.csv"):  # tuning never scored the test set
        rows = list(csv.DictReader(open(trial)))
        assert rows and all(r["test_acc"] == "" and r["val_acc"] != "" for r in rows)
    assert (killed / "report.html").exists()


def messages(out):
    """The lines of a CLI run's output without the logger's time and name."""
    return [re.sub(r"^\[[^]]*\]\[[^]]*\](\[[A-Z]+\])?\s*(- )?", "", line) for line in out.splitlines() if line.strip()]


@pytest.mark.slow  # a comparison of 8 short runs in a subprocess (15-30 s)
def test_an_own_method_from_its_folder_with_config_dir_between_the_overrides_and_a_fixed_client_rate(own_folder):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([".", str(ROOT)]), OMP_NUM_THREADS="1")  # the user's module
    proc = subprocess.run([sys.executable, "-m", "fedagg.compare", "methods=[fedavg,median_norm]", "--config-dir",
                           "my_conf", "client.lr=0.1", "budget=2", "confirm_seeds=1", "rounds=2", "device=cpu",
                           "hydra.sweep.dir=out"], cwd=own_folder, env=env, capture_output=True, text=True, timeout=600)
    out = messages(proc.stdout + proc.stderr)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, "\n".join(out[-30:])
    assert "fedavg: nothing left to tune: one trial (its defaults), not budget=2 identical ones" in out
    assert ("median_norm: 1 tuned dimension(s), 2 trial(s): its defaults (aggregator.tolerance=2), then 1 point(s) of "
            "a scrambled Sobol design in its ranges (sampler_seed=0)") in out
    folder = own_folder / "out"
    rows = [(r["method"], r["trial"], json.loads(r["params"])) for r in selection(folder)]
    u = qmc.Sobol(1, scramble=True, seed=np.random.default_rng(0)).random(1)[0, 0]  # the design's first point
    assert rows == [("fedavg", "0", {}), ("median_norm", "0", {"aggregator.tolerance": 2.0}),
                    ("median_norm", "1", {"aggregator.tolerance": float(f"{10 ** u:.6g}")})]
    for run in ("tune/median_norm/t001/s0", "confirm/default/fedavg/s1", "confirm/tuned/median_norm/s1"):
        config = json.loads((folder / run / "summary.json").read_text())["config"]
        assert config["client"]["lr"] == 0.1 and config["aggregator"]["_target_"] in (
            "my_rules.median_norm.MedianNorm", "fedagg.aggregators.base.FedAvg")
    page = (folder / "report.html").read_text()
    assert "fixed by the command line" in page
    assert ("2 trials each (but FedAvg 1: nothing left to tune); fixed by the command line, not tuned: client.lr"
            in page)


@needs_mnist
@pytest.mark.slow  # six runs on MNIST in a subprocess (15-30 s)
def test_an_experiment_file_composes_with_the_comparison(tmp_path):
    proc = compare("methods=[fedavg,fedprox]", "+experiment=comparison_mnist", "model=mlp", "budget=1",
                   "confirm_seeds=1", "rounds=1", "experiment_scale=0.05", "client.local_epochs=1",
                   f"data.root={SHARED_DATA}", f"hydra.sweep.dir={tmp_path}")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert ("+experiment=comparison_mnist sweeps aggregator, seed: ignored, the comparison chooses the methods "
            "(methods) and the seeds (tune_seeds, confirm_seeds) itself") in messages(out)
    for run, seed, objective in (("tune/fedavg/t000/s0", 0, "none"), ("confirm/tuned/fedprox/s1", 1, "fedprox")):
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        c = summary["choices"]
        assert (c["experiment"], c["dataset"], c["partition"], c["model"], c["client/objective"]) == \
               ("comparison_mnist", "mnist", "shards", "mlp", objective)
        assert (summary["seed"], summary["config"]["num_clients"], summary["config"]["client"]["batch_size"]) == \
               (seed, 100, 10)


@pytest.mark.slow  # a comparison stopped in its second trial, then finished (15-40 s)
def test_a_stopped_comparison_says_to_run_the_same_command_which_finishes_it(tmp_path):
    args = [*SMALL, f"hydra.sweep.dir={tmp_path}"]
    victim = tmp_path / "tune" / "fedprox" / "t000" / "s0"
    proc = compare(*args)
    deadline = time.time() + 300
    while not (victim / "checkpoint.pt").exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: the trial stops after its round
    out, _ = proc.communicate(timeout=300)
    lines = messages(out)
    assert proc.returncode == 130 and "Traceback" not in out
    assert json.loads((victim / "summary.json").read_text())["status"] == "interrupted"
    advice = [line for line in lines if re.search(r"continue|finish", line)]  # the job's, the trial's, the sweep's
    assert len(advice) == 3 and not [line for line in advice if "resume=true" in line]  # the comparison refuses it
    assert lines[-1] == (f"stopped: 1 job(s) interrupted or not started; the same command with "
                         f"hydra.sweep.dir={tmp_path} continues from there")
    assert re.fullmatch(r"interrupted after round \d+; the same command continues from its checkpoint",
                        next(line for line in lines if line.startswith("interrupted after round")))
    proc = compare(*args)  # the advice, followed
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0 and "resuming after round" in out, out[-3000:]
    assert [r["method"] for r in selection(tmp_path)] == ["fedavg", "fedavg", "fedprox", "fedprox"]


def test_without_optuna_the_comparison_is_one_line_naming_the_extra_and_help_still_shows():
    def run(*argv):  # as if the [compare] extra were not installed
        code = f"import sys; sys.modules['optuna'] = None; from fedagg.edge.compare_line import main; main({list(argv)!r})"
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)

    proc = run("methods=[fedavg]", "budget=1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("python -m fedagg.compare needs Optuna for its tuning studies: pip install 'fedagg[compare]' "
                           "(or pip install optuna)\n")
    proc = run("--help")
    assert proc.returncode == 0 and "  budget=16 " in proc.stdout
