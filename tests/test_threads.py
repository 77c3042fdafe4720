"""threads: auto gives each job its share of the cores (one thread for a small model); a number or the
user's OMP_NUM_THREADS wins."""

from types import SimpleNamespace

import pytest
import torch
from hydra.types import RunMode
from omegaconf import OmegaConf

from conftest import compose_config
from fedagg.runtime import threads
from fedagg.run import concurrent_jobs, train


@pytest.fixture(autouse=True)
def keep_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_choice(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 16)
    assert threads.choose(3, 10**7, 4, environ={}) == (3, "threads given")
    assert threads.choose(3, 10**7, 4, environ={"OMP_NUM_THREADS": "2"})[0] == 3  # a given number wins
    assert threads.choose("auto", 10**7, 4, environ={"OMP_NUM_THREADS": "2"})[0] is None  # then the user's variable
    assert threads.choose("auto", 10**7, 4, environ={})[0] == 4  # 16 cores, 4 jobs at once
    assert threads.choose("auto", 10**7, 32, environ={})[0] == 1
    assert threads.choose("auto", 5_000, 1, environ={})[0] == 1  # a small model: one thread
    for bad in (0, -2, "many", True, 1.5):
        with pytest.raises(ValueError, match=r"^threads=.* is not allowed; use auto or a number of threads >= 1$"):
            threads.choose(bad, 10, 1, environ={})


def test_jobs_at_once_come_from_the_launcher(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    hydra = lambda mode, launcher: SimpleNamespace(mode=mode, launcher=OmegaConf.create(launcher))  # noqa: E731
    joblib = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
    assert concurrent_jobs(hydra(RunMode.MULTIRUN, {"_target_": joblib, "n_jobs": 3})) == 3
    assert concurrent_jobs(hydra(RunMode.MULTIRUN, {"_target_": joblib, "n_jobs": -1})) == 8  # joblib: every core
    assert concurrent_jobs(hydra(RunMode.MULTIRUN, {"_target_": joblib, "n_jobs": -2})) == 7
    assert concurrent_jobs(hydra(RunMode.MULTIRUN, {"_target_": "hydra._internal.core_plugins.basic_launcher."
                                                                  "BasicLauncher"})) == 1
    assert concurrent_jobs(hydra(RunMode.RUN, {"_target_": joblib, "n_jobs": 3})) == 1


def test_a_run_sets_and_logs_its_threads(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    with caplog.at_level("INFO"):
        train(compose_config("rounds=1", "device=cpu"), tmp_path / "auto")
    assert torch.get_num_threads() == 1 and "computing with 1 torch thread(s) (auto: a small model" in caplog.text
    train(compose_config("rounds=1", "device=cpu", "threads=2"), tmp_path / "two")
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match=r"^threads='many' is not allowed"):
        train(compose_config("rounds=1", "device=cpu", "threads=many"), tmp_path / "bad")
