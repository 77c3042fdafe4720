"""Messages that name the real cause: the setting that sets a limit, the signal that stops a run at once, the run
that diverged, the module Python cannot find."""

import logging
import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, compose_config
from fedagg import run_experiment
from fedagg.config.schema import locate
from fedagg.run import train
from fedagg.runtime.interrupts import StopRequests


def test_the_concurrency_limit_names_the_held_out_clients_when_they_set_it(tmp_path):
    with pytest.raises(ValueError) as err:
        train(compose_config("dataset=digits", "rounds=1", "device=cpu", "server=async", "clock=lognormal",
                             "aggregator=fedasync", "eval.held_out_clients=0.3"), tmp_path)
    # ceil(0.3 · 10) = 3 held out: 7 can train, fewer than the 10 in flight
    assert str(err.value) == ("server.concurrency=10 is not allowed with num_clients=10 less the 3 "
                              "eval.held_out_clients=0.3 holds out: at most the 7 clients that can train may be in "
                              "flight at once")
    with pytest.raises(ValueError, match=r"^server.concurrency=10 is not allowed with num_clients=8: at most the 8 "):
        train(compose_config("dataset=digits", "rounds=1", "device=cpu", "server=async", "clock=lognormal",
                             "aggregator=fedasync", "num_clients=8"), tmp_path)


@pytest.mark.parametrize("signum, now", [(signal.SIGINT, "Ctrl-C again"),
                                         (signal.SIGTERM, f"Ctrl-C or kill -INT {os.getpid()}")],
                         ids=["SIGINT", "SIGTERM"])  # the same ids in every process that collects them
def test_the_first_stop_signal_says_how_to_stop_at_once(caplog, signum, now):
    stop = StopRequests()
    with caplog.at_level(logging.WARNING, logger="fedagg"):
        stop._handle(signum, None)
    assert stop.requested and not stop.at_once
    assert [r.getMessage() for r in caplog.records] == [
        f"{signal.Signals(signum).name} received: stopping after this round ({now} to stop now)"]
    stop._handle(signal.SIGTERM, None)  # a second SIGTERM (a sweep's forwarded one) does not stop at once
    assert not stop.at_once
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)


def test_the_divergence_line_names_the_run(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fedagg"):
        summary = run_experiment(["dataset=digits", "rounds=2", "device=cpu", "client.lr=1e30"], tmp_path / "run")
    assert summary["status"] == "diverged"
    said = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert said == [f"round 1: non-finite loss or parameters in {tmp_path / 'run'}; stopping (status: diverged)"]


def test_an_own_module_python_cannot_find_is_one_line_naming_it(tmp_path, monkeypatch):
    conf = tmp_path / "my_conf" / "aggregator"
    conf.mkdir(parents=True)
    (conf / "my_rule.yaml").write_text("_target_: my_rules.weighted.Diversity\npower: 0.5\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the user forgot PYTHONPATH=. for their my_rules/
    search = f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"
    _ends_with_the_missing_module_line(["fedagg.run", "dataset=digits", "rounds=1", "device=cpu", "aggregator=my_rule",
                                        search, f"hydra.run.dir={tmp_path / 'run'}"], env)
    # a module that is found but imports a package that is not installed says that instead
    (tmp_path / "broken_rules.py").write_text("import not_an_installed_package\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as err:
        locate("broken_rules.Rule", "aggregator._target_")
    assert str(err.value) == ("aggregator._target_=broken_rules.Rule cannot be imported: its module imports "
                              "'not_an_installed_package', which is not installed")
    # the comparison reads each method's search space from its constructor first: the same line
    _ends_with_the_missing_module_line(["fedagg.compare", "methods=[fedavg,my_rule]", "budget=2", "rounds=1",
                                        "dataset=digits", search, f"hydra.sweep.dir={tmp_path / 'compare'}"], env)


def _ends_with_the_missing_module_line(args: list[str], env: dict) -> None:
    """The command fails without a traceback, its last line naming the module and PYTHONPATH."""
    done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in said, said
    assert [line for line in said.splitlines() if line.strip()][-1].endswith(
        "aggregator._target_=my_rules.weighted.Diversity cannot be imported: Python finds no module 'my_rules'; run "
        "from the folder that holds my_rules/ with PYTHONPATH=. (or add that folder to PYTHONPATH)"), said


def test_generating_synthetic_devices_says_how_far_it_got(caplog, monkeypatch):
    from fedagg.data import synthetic

    with caplog.at_level(logging.INFO, logger="fedagg"):
        synthetic.synthetic(num_devices=3)
    assert [r for r in caplog.records if "devices (" in r.getMessage()] == []  # done within the interval: silent
    monkeypatch.setattr(synthetic, "SAY_EVERY_S", 0.0)  # every device past the interval: a line each
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedagg"):
        synthetic.synthetic(num_devices=3)
    said = [r.getMessage().rsplit(" (", 1)[0] for r in caplog.records]
    assert said == [f"dataset synthetic: drew {k} of 3 devices" for k in (1, 2, 3)] + [
        f"dataset synthetic: split {k} of 3 devices" for k in (1, 2, 3)]
