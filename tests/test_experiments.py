"""The paper-table experiments (`conf/experiment/*.yaml`) and the launchers that spread them.

Fast tests compose every table, expand its sweep and resolve every cell of it without
training; a slow test trains each whole table at a tiny scale on fake data of the real
on-disk formats; one test runs a two-job sweep through the joblib launcher.
"""

from __future__ import annotations

import copy
import csv
import functools
import inspect
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import get_object, instantiate
from omegaconf import OmegaConf, open_dict

from conftest import CONF, ROOT

from fedagg.results import table as make_table
from fedagg.results.groups import GROUPS

# jobs of each whole table, seeds included: the grid of the paper's table x 3 seeds
GRID = {
    "comparison_mnist": 4 * 2 * 3,
    "ewwa_table1": 9 * 11 * 3,
    "ewwa_table2": 5 * 11 * 3,
    "fedadp_table1": 2 * 2 * 2 * 3 * 3,
    "fedawa_table1": 9 * 3 * 3 * 3,
    "fedawa_table3": 5 * 2 * 2 * 3,
    "fedawa_table5": 3 * 2 * 2 * 3,
    "fednnnn_table2": 5 * 4 * 2 * 3,
    "fedopt_table2": 5 * 4 * 3,
    "fedprox_figures": 3 * 7 * 3 * 3,  # both figures' columns as one product (Figure 2's sets also with stragglers)
}
# backbones of fedawa.txt Table 3 that fedagg does not have: in the paper's CSV, never run
NOT_IN_FEDAGG = {("fedawa_table3", "model"): {"wrn56_4", "densenet121", "vit"},
                 ("fedprox_figures", "column"): {"sent140"}}  # FedProx's Figure 1 has Sent140; fedagg does not
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


@functools.lru_cache(maxsize=None)
def _composed(name: str, overrides: tuple[str, ...]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[f"+experiment={name}", *overrides], return_hydra_config=True)


def compose_table(name: str, *overrides: str):
    """The job config of `+experiment=name` as `python -m fedagg.run` builds it, with the
    Hydra config registered so `${hydra:runtime.choices.*}` lookups resolve."""
    cfg = copy.deepcopy(_composed(name, overrides))
    HydraConfig.instance().set_config(cfg)
    hydra_cfg = cfg.hydra
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, hydra_cfg


def sweep(hydra_cfg) -> list[dict]:
    """The sweep's jobs as {key: value} (values typed), in the order Hydra launches them."""
    params = [f"{k}={v}" for k, v in hydra_cfg.sweeper.params.items()]
    overrides = OverridesParser.create().parse_overrides(params)
    values = {o.get_key_element(): (list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]) for o in overrides}
    jobs = BasicSweeper.split_arguments(overrides, None)[0]
    assert len(jobs) == len(list(itertools.product(*values.values())))
    return [dict(zip(values, combo)) for combo in itertools.product(*values.values())]


def set_choice(group: str, option: str) -> None:
    choices = HydraConfig.get().runtime.choices
    OmegaConf.set_readonly(HydraConfig.get(), False)
    with open_dict(choices):
        choices[group] = option


def override_key(path: str) -> str:
    """Where a table key comes from on the command line: choices.X -> X, config.a.b -> a.b."""
    return path.split(".", 1)[1]


def check_kwargs(node) -> None:
    """A model/partition/dataset partial: its target exists and takes every key given."""
    params = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if not k.startswith("_")}
    target = get_object(node._target_)
    fn = target.__init__ if inspect.isclass(target) else target
    sig = inspect.signature(fn)
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        unknown = set(params) - set(sig.parameters)
        assert not unknown, f"{node._target_} takes no {sorted(unknown)}"


def test_every_table_has_its_file_and_the_papers_numbers():
    assert set(EXPERIMENTS) == set(GRID)
    for name in EXPERIMENTS:
        cfg, _ = compose_table(name)
        spec = cfg.table
        assert spec.name == name
        rows, _ = make_table.read_paper(ROOT / spec.paper)
        assert rows and set([*spec.rows, *spec.columns, "paper"]) <= set(rows[0]), name
        assert set([*spec.rows, *spec.columns]) <= set(spec["keys"]), name


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_table_composes_and_every_cell_of_its_sweep_resolves(name):
    cfg, hydra_cfg = compose_table(name)
    sweep_dir = OmegaConf.to_container(hydra_cfg.sweep, resolve=False)
    assert sweep_dir["dir"].startswith(f"outputs/tables/{name}/${{now:")
    assert "${hydra.job.num}" in sweep_dir["subdir"]
    jobs = sweep(hydra_cfg)
    assert len(jobs) == GRID[name]
    default_choices = dict(HydraConfig.get().runtime.choices)
    aggregators, partials = {}, {}
    for job in {json.dumps({k: v for k, v in j.items() if k != "seed"}, sort_keys=True): j for j in jobs}.values():
        cell = cfg  # every job sets every swept key, so the last job's values never leak
        for key, value in job.items():
            if key in GROUPS:
                assert (CONF / key / f"{value}.yaml").exists(), f"{name}: no {key} option {value}"
                set_choice(key, value)
            else:
                OmegaConf.update(cell, key, value, merge=False)
        for key in ("aggregator", "model", "dataset", "partition", "client", "rounds", "target_acc"):
            resolved = OmegaConf.to_container(cell[key], resolve=True) if OmegaConf.is_config(cell[key]) else cell[key]
            if key in ("aggregator", "model", "dataset", "partition"):
                (aggregators if key == "aggregator" else partials)[json.dumps(resolved, sort_keys=True)] = cell[key]
        assert isinstance(cell.rounds, int) and cell.rounds >= 1
        assert OmegaConf.to_container(cell.client, resolve=True)["objective"]["_target_"].startswith("fedagg.clients.objectives.")
        for group, option in default_choices.items():
            if group in GROUPS:
                set_choice(group, option)
    for node in aggregators.values():
        instantiate(node)  # every aggregator of the table, with the table's settings
    for node in partials.values():
        check_kwargs(node)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_no_cell_of_a_sweep_trips_the_ignored_choice_check(name):
    from fedagg.run import check_no_ignored_choice

    cfg, hydra_cfg = compose_table(name)
    defaults = dict(HydraConfig.get().runtime.choices)
    for job in sweep(hydra_cfg):
        check_no_ignored_choice(cfg, {**defaults, "experiment": name, **{k: v for k, v in job.items() if k in GROUPS}})


@pytest.mark.parametrize("name, override, picker", [
    ("ewwa_table1", "aggregator=fedavg", r"from method \(now method=ewwa_adam; one of fedavg, fedams, fedcams,"),
    ("ewwa_table2", "model=resnet20", r"from column \(now column=resnet20_cifar10; one of lenet_mnist,"),
    ("fedawa_table1", "model=resnet20", r"from the dataset chosen \(now dataset=cifar10\)"),
    ("fedawa_table1", "client/objective=fedprox", r"from method \(now method=fedawa; one of fedlaw,"),
    ("fednnnn_table2", "partition=iid", r"from condition \(now condition=noniid_b; one of iid_b,"),
])
def test_a_group_the_table_replaces_is_refused_naming_the_key_that_picks_it(name, override, picker, tmp_path):
    from fedagg.run import RECORDED_CHOICES, SetupError, train

    cfg, hydra_cfg = compose_table(name, override)
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if k in RECORDED_CHOICES}
    group = override.split("=")[0]
    with pytest.raises(SetupError, match=rf"^{re.escape(override)} is ignored by \+experiment={name}: it sets the {group} {picker}"):
        train(cfg, tmp_path, choices)
    assert not (tmp_path / "config.yaml").exists()  # refused before anything ran


@pytest.mark.parametrize("name, override, message", [
    ("ewwa_table2", "table.profile=foo", "table.profile='foo' is not allowed here; choose one of code, paper"),
    ("ewwa_table1", "method=nope", "method='nope' is not allowed here; choose one of fedavg, fedams, fedcams, "),
    ("fedadp_table1", "dataset=cifar10", "dataset='cifar10' is not allowed here; choose one of mnist, fmnist"),
])
def test_a_key_picking_an_option_the_file_lacks_is_one_line(name, override, message, tmp_path):
    from fedagg.run import RECORDED_CHOICES, SetupError, train

    cfg, hydra_cfg = compose_table(name, override)
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if k in RECORDED_CHOICES}
    with pytest.raises(SetupError) as err:
        train(cfg, tmp_path, choices)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert not (tmp_path / "config.yaml").exists()


@pytest.mark.parametrize("profile, expected", [
    ("code", dict(nesterov=True, weight_decay=1e-4, schedule="multistep", keep_optimizer_state=True, mean=[0.0],
                  buffers="elementwise", metric="best_test_acc", eval_every=1)),
    ("paper", dict(nesterov=False, weight_decay=0.0, schedule="constant", keep_optimizer_state=False, mean=[0.1307],
                   buffers="samples", metric="final_test_acc", eval_every=10)),
])
def test_ewwa_profiles_set_what_the_code_and_the_text_say(profile, expected):
    cfg, _ = compose_table("ewwa_table2", "method=ewwa_adam", "column=lenet_mnist", f"table.profile={profile}")
    got = dict(nesterov=cfg.client.nesterov, weight_decay=cfg.client.weight_decay, schedule=cfg.client.schedule,
               keep_optimizer_state=cfg.client.keep_optimizer_state, mean=list(cfg.dataset.mean),
               buffers=cfg.aggregator.buffers, metric=cfg.table.metric, eval_every=cfg.eval_every)
    assert got == expected
    assert (cfg.client.local_epochs, cfg.client.lr, cfg.client.momentum, cfg.client.batch_size) == (1, 0.01, 0.9, 64)
    # the code's MultiStepLR at R//3 and 2(R//3): 0.01 up to round 166, 0.001 to 332, then 1e-4 (R = 500)
    trainer = instantiate(cfg.client)
    assert [trainer.lr_at(r, 500) for r in (166, 167, 332, 333)] == pytest.approx(
        [0.01, 0.001, 0.001, 0.0001] if profile == "code" else [0.01] * 4)
    assert [trainer.lr_at(r, 100) for r in (33, 34, 66, 67)] == pytest.approx(
        [0.01, 0.001, 0.001, 0.0001] if profile == "code" else [0.01] * 4)


@pytest.mark.parametrize("name", ["fedawa_table1", "fedawa_table3", "fedawa_table5"])
@pytest.mark.parametrize("profile, rounds, val_frac, kept, mu, adam", [
    ("code", 300, 0.3, True, 0.001, (1.0, 1e-5)),
    ("paper", 200, None, False, 0.01, (0.01, 1e-3)),
])
def test_fedawa_profiles_set_what_the_code_and_the_text_say(name, profile, rounds, val_frac, kept, mu, adam):
    cfg, _ = compose_table(name, "method=fedprox", f"table.profile={profile}")
    assert (cfg.rounds, cfg.client.val_frac, cfg.client.keep_optimizer_state, cfg.client.objective.mu) == (rounds, val_frac, kept, mu)
    assert cfg.dataset.augment is False and (cfg.client.lr, cfg.client.batch_size, cfg.num_clients) == (0.08, 128, 20)
    cfg, _ = compose_table(name, "method=fedadam", f"table.profile={profile}")
    assert (cfg.aggregator.lr, cfg.aggregator.tau) == adam


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_paper_cell_is_a_cell_of_the_sweep(name):
    cfg, hydra_cfg = compose_table(name)
    spec = cfg.table
    jobs = sweep(hydra_cfg)
    paper, _ = make_table.read_paper(ROOT / spec.paper)
    for key in [*spec.rows, *spec.columns]:
        swept = override_key(spec["keys"][key])
        if jobs and swept in jobs[0]:
            values = {str(j[swept]) for j in jobs}
        else:
            values = {str(OmegaConf.select(cfg, swept) if spec["keys"][key].startswith("config.")
                          else HydraConfig.get().runtime.choices[swept])}
        wanted = {p[key] for p in paper} - NOT_IN_FEDAGG.get((name, key), set())
        assert wanted <= values, f"{name}: paper cells {sorted(wanted - values)} of {key} are not in the sweep"


def test_launcher_configs_compose():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        joblib = compose(config_name="config", overrides=["hydra/launcher=joblib"], return_hydra_config=True)
        slurm = compose(config_name="config", overrides=["hydra/launcher=submitit_slurm"], return_hydra_config=True)
    assert joblib.hydra.launcher._target_.endswith("JoblibLauncher") and joblib.hydra.launcher.n_jobs >= 2
    assert slurm.hydra.launcher._target_.endswith("SlurmLauncher") and slurm.hydra.launcher.gpus_per_node == 1
    assert slurm.hydra.launcher.timeout_min > 0 and "partition" in slurm.hydra.launcher


@pytest.mark.slow  # ~15-20 s on 2 idle cores
def test_two_job_sweep_through_the_joblib_launcher(tmp_path):
    """Jobs run in worker processes, so the task must survive pickling (see fedagg/run.py)."""
    cmd = [sys.executable, "-m", "fedagg.run", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
           "rounds=1", "device=cpu", "seed=0,1", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads((tmp_path / str(i) / "summary.json").read_text()) for i in range(2)]
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert [s["seed"] for s in summaries] == [0, 1]
    assert OmegaConf.load(tmp_path / "multirun.yaml").hydra.launcher._target_.endswith("JoblibLauncher")
    # each of the 2 jobs at once gets its share of the cores, or one thread for this small model
    assert all("computing with 1 torch thread(s)" in (tmp_path / str(i) / "run.log").read_text() for i in range(2))


@pytest.mark.slow  # a CLI subprocess of 10-30 s; the default suite must stay under 10 minutes
def test_two_job_sweep_through_the_submitit_launcher(tmp_path):
    """The Slurm configuration's code path, run by real submitit on this machine (submitit_local)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cmd = [sys.executable, "-m", "fedagg.run", "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
           "rounds=1", "device=cpu", "seed=0,1", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads((tmp_path / str(i) / "summary.json").read_text()) for i in range(2)]
    assert [(s["status"], s["seed"]) for s in summaries] == [("completed", 0), ("completed", 1)]
    assert list((tmp_path / ".submitit").glob("*/*_result.pkl"))  # submitit ran the jobs and kept their results
    assert f"sweep {tmp_path}: 2 completed" in proc.stdout + proc.stderr


# --- slow: every table end to end at a tiny scale -----------------------------------------


FAKE_CIFAR_TRAIN = 5000  # training images of each fake CIFAR set (write_fake_data)


def write_fake_data(root: Path) -> None:
    """Every dataset the tables use, in the real on-disk formats, big enough for their splits
    (100 clients of 2 shards, FedAdp's 600-sample nodes, Dirichlet(0.1) over 20 clients, FedProx's
    200 FEMNIST writers, Reddi et al.'s 10 clients a round of FEMNIST and Shakespeare; Synthetic is
    generated, no files)."""
    import numpy as np

    from fake_datasets import solid_jpeg, write_cifar, write_fashion_mnist, write_idx_gz, write_imagenet
    from fake_leaf import write_femnist, write_shakespeare

    rng = np.random.default_rng(0)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in (("train", 12000), ("t10k", 500)):
        write_idx_gz(raw / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx_gz(raw / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, n).astype(np.uint8))
    write_fashion_mnist(root, n_train=12000, n_test=500)
    write_cifar(root, per_file=FAKE_CIFAR_TRAIN // 5)  # 5 training batches
    write_cifar(root, hundred=True, per_file=FAKE_CIFAR_TRAIN)
    # LEAF's all_data JSON, read before TFF's h5 (no download): 220 writers and 12 roles of 4 samples,
    # each split 3/1 into train/test by the loaders (FEMNIST 90%, Shakespeare 80%, at least one on each side)
    write_femnist(root, sizes=((4,) * 110, (4,) * 110))
    # and writers of the letters a-j (LEAF labels 36-45), 120 images each, for FedProx's FEMNIST (femnist_fedprox)
    letters = {f"letters{w}": {"x": [[(36 + c) / 255] * 784 for c in range(10) for _ in range(12)],
                               "y": [36 + c for c in range(10) for _ in range(12)]} for w in range(10)}
    (root / "femnist" / "all_data" / "all_data_9.json").write_text(json.dumps({"users": list(letters), "user_data": letters}))
    write_shakespeare(root, sizes=(4,) * 12)
    write_imagenet(root)
    folder = root / "tiny-imagenet-200"  # 10 classes x 60 training images, solid colours
    wnids = [f"n{i:08d}" for i in range(10)]
    (folder / "wnids.txt").parent.mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    lines = []
    for c, wnid in enumerate(wnids):
        for i in range(60):
            solid_jpeg(folder / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", (64, 64), (25 * c, 4 * i, 100))
        solid_jpeg(folder / "val" / "images" / f"val_{c}.JPEG", (64, 64), (25 * c, 0, 100))
        lines.append(f"val_{c}.JPEG\t{wnid}\t0\t0\t63\t63")
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_table_runs_end_to_end_at_a_tiny_scale(name, tmp_path, monkeypatch, request):
    """Every cell of the table (seed 0) trains about one round (experiment_scale = 1/rounds)
    on that share of the data, and make_table fills every cell of the paper's layout."""
    import torch

    from fedagg.run import GROUPS as RUN_GROUPS
    from fedagg.run import train

    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # hundreds of one-sample batches: threads only add overhead
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    write_fake_data(tmp_path / "data")
    default, hydra_cfg = compose_table(name)
    scale = 1 / default.rounds
    out = tmp_path / "sweep"
    for i, job in enumerate(j for j in sweep(hydra_cfg) if j.get("seed", 0) == 0):
        overrides = [f"{k}={v}" for k, v in job.items()] + [
            f"experiment_scale={scale}", "device=cpu", f"data.root={tmp_path / 'data'}", "checkpoint_every=0"]
        cfg, hcfg = compose_table(name, *overrides)
        # fake data: no official checksums, and fewer samples than Dirichlet(0.1)'s min_size wants
        if "verify_md5" in cfg.dataset:
            cfg.dataset.verify_md5 = False
        if "min_size" in cfg.partition and "alpha" in cfg.partition:
            cfg.partition.min_size = 1
        if "samples_per_client" in cfg.partition and str(cfg.partition._target_).endswith(".pachinko"):
            # Reddi et al.'s 500 Pachinko clients of 100 CIFAR images need 50,000; the fake sets hold 5,000
            cfg.partition.samples_per_client = min(cfg.partition.samples_per_client, FAKE_CIFAR_TRAIN // cfg.num_clients)
        if "class_choice" in cfg.partition:
            cfg.partition.class_choice = "balanced"  # ~1,000 fake images a class: independent picks can overdraw one
        if str(cfg.dataset._target_).endswith("femnist_fedprox"):
            cfg.dataset.num_devices = cfg.num_clients = cfg.clients_per_round = 4  # 200 devices: ~19,000 letter images
        if str(cfg.dataset._target_).endswith("leaf.shakespeare") and cfg.num_clients is not None:
            cfg.num_clients = None  # the fake files hold 12 roles; FedProx's figures sample 143
        if (cfg.client.get("val_frac") or 0) >= 0.3:
            cfg.client.val_frac = None  # clients of one or two samples cannot hold out FedAWA code's 30%
        if str(cfg.aggregator._target_).endswith("FedLAW"):
            cfg.aggregator.server_epochs = 1  # 100 passes over the proxy set: minutes on a CPU
        choices = {k: v for k, v in hcfg.runtime.choices.items() if k in RUN_GROUPS or k == "experiment"}
        summary = train(cfg, out / f"{i}", choices)
        assert summary["status"] in ("completed", "diverged"), (job, summary.get("error"))
        for leftover in ("checkpoint.pt", "checkpoint.prev.pt", "model.pt"):  # make_table reads summary.json only;
            (out / f"{i}" / leftover).unlink(missing_ok=True)  # 20 clients' kept ResNet-18 momentum: ~0.9 GB a cell
    assert make_table.main([str(out)]) == 0
    table = (out / "table.md").read_text()
    assert f"Scaled runs (experiment_scale = {make_table.key_text(scale)})" in table
    with open(out / "table.csv", newline="") as f:
        cells = list(csv.DictReader(f))
    ran = [c for c in cells if int(c["n_runs"]) > 0]
    assert len(ran) == GRID[name] // 3


def test_an_objective_an_experiment_selects_per_method_is_checked_where_it_stands():
    """`client.objective: ${oc.select:table.methods.${method}.objective,...}` chooses a whole node whose own
    ${table.profiles...} resolve only in the config: the checks once copied it out and failed every FedProx cell."""
    from fedagg.config.schema import check_config
    from fedagg.run import GROUPS as RUN_GROUPS

    cfg, _ = compose_table("fedawa_table1", "method=fedprox")
    check_config(cfg, RUN_GROUPS)  # raised InterpolationKeyError: 'table.profile' not found
    assert cfg.client.objective.mu == cfg.table.profiles[cfg.table.profile].fedprox_mu > 0
