"""A single run's command line is explained only when Hydra stops before the run begins; a sweep's before it starts."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT
from fedagg.edge import start as start_module
from fedagg.edge.start import FULL_ERROR, job_started, start


@pytest.fixture
def explained(monkeypatch):
    calls = []

    def explain(argv):
        calls.append(list(argv))
        return "aggregator=FedAvg is not an option" if "aggregator=FedAvg" in argv else None

    monkeypatch.setattr(start_module, "explain_composition_error", explain)
    monkeypatch.delenv(FULL_ERROR, raising=False)
    return calls


def test_a_single_run_that_composes_is_not_composed_twice_and_its_task_sees_the_users_setting(explained):
    seen = []

    def main():  # Hydra composed; the task begins
        seen.append(os.environ.get(FULL_ERROR))
        job_started()
        seen.append(os.environ.get(FULL_ERROR))

    start(main, ["rounds=1"])
    assert explained == [] and seen == ["1", None] and FULL_ERROR not in os.environ


def test_a_users_own_full_error_setting_is_kept(explained, monkeypatch):
    monkeypatch.setenv(FULL_ERROR, "0")
    seen = []
    start(lambda: seen.append(os.environ[FULL_ERROR]) or job_started() or seen.append(os.environ[FULL_ERROR]), [])
    assert seen == ["1", "0"] and os.environ[FULL_ERROR] == "0"


def test_a_single_run_hydra_cannot_compose_is_one_line_and_exit_2(explained, capsys):
    def main():
        raise RuntimeError("Hydra's composition error")

    with pytest.raises(SystemExit) as stop:
        start(main, ["aggregator=FedAvg"])
    assert stop.value.code == 2 and capsys.readouterr().err == "aggregator=FedAvg is not an option\n"
    assert explained == [["aggregator=FedAvg"]] and FULL_ERROR not in os.environ


def test_a_sweep_is_explained_before_hydra_starts(explained, capsys):
    with pytest.raises(SystemExit) as stop:
        start(lambda: pytest.fail("Hydra must not start"), ["-m", "aggregator=FedAvg"])
    assert stop.value.code == 2 and explained == [["-m", "aggregator=FedAvg"]]
    start(lambda: None, ["-m", "seed=0,1"])  # one that composes starts
    assert explained[-1] == ["-m", "seed=0,1"] and FULL_ERROR not in os.environ


def test_what_no_line_explains_is_reported_by_hydra_as_before(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedagg.run", "rounds=[1", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == ("no viable alternative at input '[1'\n"  # Hydra's words, as it printed them before
                           "See https://hydra.cc/docs/1.2/advanced/override_grammar/basic for details\n\n"
                           "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")
    assert not (tmp_path / "run").exists()


COMPOSED_TWICE = """
import json, sys
import hydra
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from fedagg.edge import CONF
from fedagg.edge.start import start

loads, seen = [], []
real = ConfigLoaderImpl.load_configuration
ConfigLoaderImpl.load_configuration = lambda self, *a, **k: loads.append(1) or real(self, *a, **k)

@hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")
def task(cfg):
    seen.append((OmegaConf.to_yaml(cfg), OmegaConf.to_yaml(HydraConfig.get()), len(loads)))

argv = json.loads(sys.argv[1])
sys.argv = ["fedagg.run", *argv]
start(task, argv)  # fedagg's start: composed once
task()  # Hydra's own way: composed twice
ours, its = seen
print(json.dumps([ours[0] == its[0], ours[1] == its[1], ours[2], its[2] - ours[2]]))
"""


@pytest.mark.parametrize("argv", [[], ["rounds=2", "aggregator=fedadam", "aggregator.lr=0.1"],
                                  ["+experiment=fedadp_table1"], ["hydra.mode=RUN", "seed=3"]])
def test_a_single_run_is_composed_once_into_the_config_hydra_composes_twice(tmp_path, argv):
    argv = [*argv, f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "-c", COMPOSED_TWICE, __import__("json").dumps(argv)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "[true, true, 1, 2]"  # the same job config and hydra node, composed once


EXIT_NOW = """
import atexit, sys, threading, time
from fedagg.edge.start import exit_now
atexit.register(lambda: print("atexit ran", flush=False))
print("buffered", end=" ")
code = {"none": None, "two": 2, "words": "a message"}[sys.argv[1]]
if sys.argv[2] == "thread":  # a thread that is not a daemon: the normal exit, which waits for it
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", end=" "))).start()
exit_now(code)
print("never")
"""


@pytest.mark.parametrize("code, status, err", [("none", 0, ""), ("two", 2, ""), ("words", 1, "a message\n")])
@pytest.mark.parametrize("thread", ["alone", "thread"])
def test_exit_now_runs_the_atexit_functions_flushes_and_exits_with_the_status_sys_exit_gives(code, status, err,
                                                                                                thread):
    proc = subprocess.run([sys.executable, "-c", EXIT_NOW, code, thread], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    waited = "thread done " if thread == "thread" else ""
    assert (proc.returncode, proc.stdout, proc.stderr) == (status, f"buffered {waited}atexit ran\n", err)


def test_the_package_and_the_drawing_process_import_without_torch():
    """`python -m fedagg.run` imports the package, then starts partition.png's process on its first line: neither
    may import torch, or the drawing process would start after torch's second of imports instead of beside it."""
    code = "import sys, fedagg, fedagg.data.painter; print('torch' in sys.modules, fedagg.RoundInputs.__name__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (proc.returncode, proc.stdout) == (0, "False RoundInputs\n"), proc.stderr  # the API, imported when asked
