"""Command lines Hydra cannot compose (a mistyped option or key): one line with the right suggestion, exit 2."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from fedagg.run import explain_composition_error, run_experiment

OPTIONS = ("abavg, acc_inverse, centered_clip, elastic, ewwa, fedadagrad, fedadam, fedadp, fedams, fedasync, fedavg, "
           "fedavgm, fedawa, fedawa_l, fedbn, fedbuff, fedcams, feddisco, feddyn, fedex_lora, fedexp, fedit, fedlaw, "
           "fedmomentum, fednnnn, fednova, fedsa_lora, fedyogi, ffa_lora, flexlora, flora, geomed, hetlora, ida, krum, "
           "ldawa, median, multikrum, normnorm, scaffold, trimmed_mean")
BUCKETED = "aggregator=centered_clip, geomed, krum, median, multikrum, trimmed_mean"
SWEEP_PLUS = ("aggregator.bucket_size=2 is applied before the sweep picks the aggregator, to aggregator=fedavg, which "
              "has no bucket_size: write ++aggregator.bucket_size=2 to set it in every job")


@pytest.mark.parametrize("argv, line", [
    (["aggregator=FedAvg"], f"aggregator=FedAvg is not an option; did you mean aggregator=fedavg? (options: {OPTIONS})"),
    (["-m", "aggregator=fedavg,Median"],
     f"aggregator=Median is not an option; did you mean aggregator=median? (options: {OPTIONS})"),
    (["client/objective=prox"], "client/objective=prox is not an option; did you mean client/objective=fedprox? "
                                "(options: feddecorr, feddyn, fedlc, fedntd, fedprox, moon, none)"),
    (["aggregator=zzz"], f"aggregator=zzz is not an option (options: {OPTIONS}); an option of your own needs its folder "
                         "searched: aggregator/zzz.yaml in DIR and hydra.searchpath=[file://DIR] on the command line"),
    (["aggregator.bucket_sizee=3"], "aggregator.bucket_sizee is not a setting fedagg knows; did you mean "
                                    f"aggregator.bucket_size=3? ({BUCKETED} have it, aggregator=fedavg does not)"),
    (["aggregator=median", "aggregator.bucket_sizee=3"],
     "aggregator.bucket_sizee is not a setting fedagg knows; did you mean aggregator.bucket_size=3?"),
    (["rounds=1", "seeed=1"], "seeed is not a setting fedagg knows; did you mean seed=1?"),
    (["foo=1"], "foo is not a setting fedagg knows (known keys: adapter, aggregator, attack, channel, checkpoint_every, client, "
                "clients_per_round, clock, data, dataset, deterministic, device, engine, eval, eval_every, "
                "experiment_scale, logger, model, num_clients, overwrite, partition, resume, rounds, sampler, seed, "
                "server, stop_at_target, system, target_acc, tf32, threads); remove it or correct its name"),
    (["aggregator.bucket_size=3"], f"aggregator.bucket_size=3 is not allowed: aggregator=fedavg has no bucket_size; "
                                   f"{BUCKETED} have it"),
    (["-m", "aggregator=fedavg,median", "aggregator.bucket_size=2,4"],
     f"aggregator.bucket_size=2,4 is not allowed: aggregator=fedavg has no bucket_size; {BUCKETED} have it"),
    (["-m", "aggregator=median,trimmed_mean", "aggregator.bucket_size=2"], SWEEP_PLUS),
    (["-m", "aggregator=median,krum", "aggregator.bucket_sizee=2,3"],
     "aggregator.bucket_sizee is not a setting fedagg knows; did you mean aggregator.bucket_size=2,3?"),
    # adapters are a group of their own here, beside the model (which a dataset may choose), whatever the spelling
    (["model.adapter=lora"], "model.adapter=lora is not allowed: adapter is a group of its own, beside model; "
                             "write adapter=lora"),
    (["model=mlp", "model.adapter.rank=8"], "model.adapter.rank=8 is not allowed: adapter is a group of its own, "
                                            "beside model; write adapter.rank=8"),
    (["model/adapter=lora"], "model/adapter=lora is not allowed: adapter is a group of its own, beside model; "
                             "write adapter=lora"),
    (["aggregator=median", "+aggregator.bucket_size=3"],
     "+aggregator.bucket_size=3 adds a key the config already has: write aggregator.bucket_size=3 to change it"),
    (["-m", "aggregator=fedavg,median", "+aggregator.bucket_size=2"],
     "+aggregator.bucket_size=2 adds a key that aggregator=median already has, which Hydra refuses in that job: "
     "write ++aggregator.bucket_size=2 to add or set it in every job"),
])
def test_a_mistyped_option_or_key_is_one_line_with_the_right_suggestion(argv, line):
    assert explain_composition_error(argv) == line


@pytest.mark.parametrize("argv", [
    ["rounds=1", "aggregator=median", "aggregator.bucket_size=2"],
    ["-m", "aggregator=median,trimmed_mean", "++aggregator.bucket_size=2"],
    ["-m", "aggregator=fedavg,median", "seed=0,1", "hydra.sweep.dir=x"],
    ["--cfg", "job", "aggregator=FedAvg"],  # flags: Hydra's own handling
    ["+experiment=fedadp_table1"],
])
def test_command_lines_that_compose_are_left_to_hydra(argv):
    assert explain_composition_error(argv) is None


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "fedagg.run", *args], cwd=ROOT, capture_output=True, text=True)


def test_model_adapter_on_the_command_line_is_the_adapter_group(tmp_path):
    done = run_cli("model.adapter=lora", "model.adapter.rank=2", "aggregator=fedit", "rounds=1", "device=cpu",
                   f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    assert "LoRA adapters (rank 2, alpha 8) on 2 Linear layers" in done.stdout + done.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["adapter"]["rank"] == 2


@pytest.mark.parametrize("args, line", [
    (["aggregator=FedAvg"], f"aggregator=FedAvg is not an option; did you mean aggregator=fedavg? (options: {OPTIONS})"),
    (["-m", "aggregator=median,trimmed_mean", "aggregator.bucket_size=2"], SWEEP_PLUS),
])
def test_the_command_line_prints_only_that_line(tmp_path, args, line):
    proc = run_cli(*args, "rounds=1", f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", line + "\n")
    assert list(tmp_path.iterdir()) == []  # nothing started


@pytest.mark.slow  # a CLI subprocess of 10-30 s; the default suite must stay under 10 minutes
def test_the_suggested_plus_plus_works_in_a_sweep_and_a_single_run(tmp_path):
    sweep = run_cli("-m", "aggregator=median,trimmed_mean", "++aggregator.bucket_size=2", "rounds=1", "device=cpu",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert sweep.returncode == 0 and "Traceback" not in sweep.stdout + sweep.stderr, sweep.stderr[-2000:]
    single = ["aggregator=median", "++aggregator.bucket_size=2", "rounds=1", "device=cpu"]
    assert explain_composition_error(single) is None
    run_experiment(single, tmp_path / "run")  # composed as the command line composes it
    for folder, aggregator in ((tmp_path / "sweep" / "0", "median"), (tmp_path / "sweep" / "1", "trimmed_mean"),
                               (tmp_path / "run", "median")):
        summary = json.loads((folder / "summary.json").read_text())
        assert (summary["status"], summary["choices"]["aggregator"]) == ("completed", aggregator)
        assert summary["config"]["aggregator"]["bucket_size"] == 2
