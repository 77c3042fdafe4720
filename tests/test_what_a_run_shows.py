"""What real runs show a person: the console's lines (a stacked sweep's start-up and job table, the final line's
number, missing data said once), the titles of the plots and of partition.png, and a failed download's folders."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from conftest import ROOT
from fedagg.results import plots

SWEEP = ["rounds=2", "num_clients=4", "target_acc=0.7", "aggregator=fedavg,fedadp", "seed=0,1"]
PARTITION = "dirichlet alpha=0.5 min_size=10 max_retries=100"  # conf/partition/dirichlet.yaml's parameters


def fedagg(*args: str, cwd: Path = ROOT, module: str = "fedagg.run") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def summaries(folder: Path) -> dict[int, dict]:
    return {int(p.parent.name): json.loads(p.read_text()) for p in folder.glob("*/summary.json")}


@pytest.fixture(scope="module")
def stacked(tmp_path_factory) -> tuple[Path, str]:
    """Four jobs (two methods, two seeds) through the stacked launcher, as a user types it: its folder and console."""
    folder = tmp_path_factory.mktemp("stacked")
    proc = fedagg("-m", "hydra/launcher=stacked", *SWEEP, f"hydra.sweep.dir={folder}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return folder, proc.stdout + proc.stderr


def test_a_stacked_sweep_says_its_start_up_once_and_which_job_has_which_settings(stacked):
    folder, out = stacked
    assert out.count("digits: 1437 train / 360 test samples, 4 clients") == 1, out  # not once a job
    assert out.count("computing with 1 torch thread(s)") == 1, out
    assert "every job: rounds=2 num_clients=4 target_acc=0.7" in out
    jobs = summaries(folder)
    assert sorted(jobs) == [0, 1, 2, 3]
    for num, s in jobs.items():
        # the table's line of job N names the settings that job ran with, as its summary.json records them
        [line] = re.findall(rf"\] #{num} (aggregator=\S+ seed=\S+)\n", out)
        assert line == f"aggregator={s['choices']['aggregator']} seed={s['seed']}"
        # every job's start-up is in its own run.log, unnumbered
        log = (folder / str(num) / "run.log").read_text()
        assert "digits: 1437 train / 360 test samples" in log and f"#{num} " not in log


def test_the_final_line_says_how_soon_the_target_was_reached(stacked):
    folder, out = stacked
    jobs = summaries(folder)
    for num, s in jobs.items():
        end = f"#{num} completed: final test accuracy {s['final_test_acc']:.4f} after 2 rounds ({folder / str(num)}); "
        reached = (f"target_acc 0.7 not reached" if s["rounds_to_target"] is None
                   else f"target_acc 0.7 reached at round {s['rounds_to_target']}")
        assert f"{end}{reached}\n" in out, out
    # both lines are seen: FedAdp's seed 0 ends at 0.586, the others above 0.7
    assert {s["rounds_to_target"] is None for s in jobs.values()} == {True, False}


def test_fedbns_final_line_is_the_per_client_mean_and_time_to_target_is_on_it(tmp_path):
    proc = fedagg("rounds=2", "num_clients=4", "aggregator=fedbn", "model=cnn_bn", "eval.per_client=true",
                  "clock=lognormal", "target_acc=0.05", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert s["final_client_acc_mean"] != s["final_test_acc"]  # two numbers a line could confuse
    assert last.endswith(f"completed: mean client accuracy {s['final_client_acc_mean']:.4f} (each client's own model on "
                         f"its own test split; the averaged model's test accuracy {s['final_test_acc']:.4f}) after 2 "
                         f"rounds ({tmp_path}); target_acc 0.05 reached at round {s['rounds_to_target']}, "
                         f"time_to_target {s['time_to_target']:.1f} s"), last
    # partition.png names the partition and its alpha, on the picture and in its text
    assert Image.open(tmp_path / "partition.png").text["Title"] == (
        f"Partition {PARTITION} of digits\n4 clients, 1437 samples, 10 classes")


def titles(monkeypatch) -> dict[str, list[str]]:
    """What each plot's panels are titled: plots.main's figures, read as they are closed."""
    seen: dict[str, list[str]] = {}
    close = plots.plt.close

    def recording(fig):
        seen[f"figure {len(seen)}"] = [ax.get_title() for ax in fig.axes if ax.get_visible()]
        close(fig)

    monkeypatch.setattr(plots.plt, "close", recording)
    return seen


def test_plot_titles_name_the_runs_settings_and_weights_shows_every_seed(stacked, tmp_path, monkeypatch, capsys):
    folder, _ = stacked
    seen = titles(monkeypatch)
    assert plots.main([str(folder), "--out", str(tmp_path), "--wandb-mode", "disabled"]) == 0
    accuracy, norms, weights = seen["figure 0"], seen["figure 1"], seen["figure 2"]
    # two methods on one panel: what they share, not the folder's name
    assert accuracy == norms == [f"digits\n{PARTITION}"], (accuracy, folder.name)
    jobs = summaries(folder)
    expected = sorted(f"{'FedAvg' if s['choices']['aggregator'] == 'fedavg' else 'FedAdp'} · digits\n{PARTITION} · "
                      f"seed {s['seed']}" for s in jobs.values())
    assert sorted(weights) == expected and len(set(weights)) == 4  # a panel per method and seed

    seen.clear()
    assert plots.main([str(folder), "--out", str(tmp_path), "--wandb-mode", "disabled", "--max-weight-panels", "2"]) == 0
    # cut to two: each method's first seed, not one method's two seeds
    assert sorted(seen["figure 2"]) == [f"FedAdp · digits\n{PARTITION} · seed 0", f"FedAvg · digits\n{PARTITION} · seed 0"]
    assert "weights.png shows 2 of 4 runs (--max-weight-panels 4 shows all)" in capsys.readouterr().err


def offline_mnist(tmp_path: Path) -> Path:
    """A launcher script: `python -m fedagg.run` or `fedagg.compare` whose MNIST source is a closed port."""
    script = tmp_path / "offline.py"
    script.write_text(
        "import runpy, sys\n"
        "from fedagg.data import download\n"
        "real = download.source('mnist')\n"
        "download.SOURCES['mnist'] = download.Source(tuple(('http://127.0.0.1:9/' + url.rsplit('/', 1)[1], md5)\n"
        "                                                  for url, md5 in real.files), real.target, real.archive)\n"
        "module = sys.argv.pop(1)\n"
        "runpy.run_module(module, run_name='__main__', alter_sys=True)\n")
    return script


def run_offline(tmp_path: Path, module: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(offline_mnist(tmp_path)), module, *args, "dataset=mnist", "rounds=1",
                           f"data.root={tmp_path / 'empty' / 'data'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_a_sweep_whose_data_is_missing_says_so_once_and_leaves_no_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    out = run_offline(tmp_path, "fedagg.run", "-m", "seed=0,1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert out.count("mnist: could not download http://127.0.0.1:9/") == 1, out
    assert "set data.root to a folder that holds MNIST/" in out  # the fix
    assert f"failed: 3 jobs ({tmp_path / 'sweep'}/ 0, 1, 2) with the error above" in out
    assert list((tmp_path / "empty").iterdir()) == []  # no data/ that holds nothing


def test_a_comparison_whose_data_is_missing_says_so_once_and_what_to_do(tmp_path):
    pytest.importorskip("optuna")
    (tmp_path / "empty").mkdir()
    out = run_offline(tmp_path, "fedagg.compare", "methods=[fedavg,fedprox]", "budget=2", "tune_seeds=[0]",
                      "confirm_seeds=1", f"hydra.sweep.dir={tmp_path / 'cmp'}")
    assert out.count("mnist: could not download http://127.0.0.1:9/") == 1, out
    assert "tuning stopped: trial" in out and "once that is fixed, the same command" in out
    assert "its trial stays open: the same command" not in out  # not the advice for a stopped trial
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_failed_download_removes_the_folders_it_made_and_only_those(tmp_path, monkeypatch):
    from fedagg.data import download

    monkeypatch.setenv("FEDAGG_CACHE", str(tmp_path / "cache"))
    closed = download.Source((("http://127.0.0.1:9/x.tar.gz", "0" * 32),), "x", True)  # refused at once
    monkeypatch.setitem(download.SOURCES, "cifar10", closed)
    (tmp_path / "kept").mkdir()
    for root in (tmp_path / "kept" / "new" / "data", tmp_path / "kept"):
        with pytest.raises(download.DownloadError, match="could not download http://127.0.0.1:9/x.tar.gz"):
            download.fetch("cifar10", root, "copy it by hand", present=lambda: False)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "kept"]  # the folder that was there stays
        assert list((tmp_path / "kept").iterdir()) == []
