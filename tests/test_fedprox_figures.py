"""`+experiment=fedprox_figures`: every cell of FedProx's Figures 1 and 2 resolves to the settings of
../shared/papers/fedopt-fedprox-settings.md (P: the paper's text; R: litian96/FedProx@d2a4501),
written out here by hand, not read from the YAML."""

import copy

from omegaconf import OmegaConf

from conftest import ROOT
from test_experiments import compose_table, sweep
from fedagg.results import table as make_table

# column -> (dataset target, its parameters that matter, model target, partition, rounds, num_clients, lr, best mu)
SYNTHETIC = "fedagg.data.synthetic.synthetic"
MLR = "fedagg.models.simple.MLR"
NATURAL = ("fedagg.data.natural.natural", {})
COLUMNS = {
    # R rounds 200, P C.2 lr 0.01, P 5.3.2 mu 1, P 5.1 / R 30 devices
    "synthetic_iid": (SYNTHETIC, {"alpha": 0.0, "beta": 0.0, "iid": True, "num_devices": 30}, MLR, NATURAL, 200, 30,
                      0.01, 1.0),
    "synthetic_0_0": (SYNTHETIC, {"alpha": 0.0, "beta": 0.0, "iid": False, "num_devices": 30}, MLR, NATURAL, 200, 30,
                      0.01, 1.0),
    "synthetic_05_05": (SYNTHETIC, {"alpha": 0.5, "beta": 0.5, "iid": False, "num_devices": 30}, MLR, NATURAL, 200,
                        30, 0.01, 1.0),
    "synthetic_1_1": (SYNTHETIC, {"alpha": 1.0, "beta": 1.0, "iid": False, "num_devices": 30}, MLR, NATURAL, 200, 30,
                      0.01, 1.0),
    # MNIST: R 100 rounds, P C.2 lr 0.03, mu 1; FedProx's devices (R data/mnist/generate_niid.py:20-80): 1,000, 5 images
    # of each of 2 digits, then lognormal(0, 2) shares, 90/10 per device
    "mnist": ("fedagg.data.mnist_fedprox.mnist_fedprox", {"num_devices": 1000, "first": 5, "sigma": 2.0,
                                                          "train_frac": 0.9}, MLR, NATURAL, 100, 1000, 0.03, 1.0),
    # FEMNIST: FedProx's own split, 200 devices of 3 letters (R my_sample.py), R 200 rounds, P C.2 lr 0.003, mu 1
    "femnist": ("fedagg.data.femnist_fedprox.femnist_fedprox", {"num_devices": 200, "classes_per_device": 3}, MLR,
                NATURAL, 200, 200, 0.003, 1.0),
    # Shakespeare: R 40 rounds, P C.2 lr 0.8, P 5.3.2 mu 0.001; 143 devices (R README.md:36)
    "shakespeare": ("fedagg.data.leaf.shakespeare", {}, "fedagg.models.leaf.LSTMShakespeare", NATURAL, 40, 143, 0.8,
                    0.001),
}
# method -> (client objective target, mu (None: the column's best), what happens to stragglers' work)
METHODS = {
    "fedavg": ("fedagg.clients.objectives.Objective", None, "drop"),  # P 5.2, R fedavg.py:35
    "fedprox0": ("fedagg.clients.objectives.FedProx", 0.0, "keep"),  # R fedprox.py:57-71
    "fedprox": ("fedagg.clients.objectives.FedProx", None, "keep"),
}
FIGURE_1 = {(m, c, f) for m in METHODS for c in ("synthetic_1_1", "mnist", "femnist", "shakespeare", "sent140")
            for f in ("0.0", "0.5", "0.9")}
FIGURE_2 = {(m, c, "0.0") for m in ("fedprox0", "fedprox")
            for c in ("synthetic_iid", "synthetic_0_0", "synthetic_05_05", "synthetic_1_1")}


def test_every_cell_resolves_to_the_papers_settings():
    base, hydra_cfg = compose_table("fedprox_figures")
    jobs = sweep(hydra_cfg)
    assert len(jobs) == 3 * 7 * 3 * 3 and {j["seed"] for j in jobs} == {0, 1, 2}
    cells = {(j["method"], j["column"], j["system.fraction"]) for j in jobs}
    assert {(m, c, str(f)) for m, c, f in cells} >= (FIGURE_1 | FIGURE_2) - {c for c in FIGURE_1 if c[1] == "sent140"}
    for method, column, fraction in sorted(cells):
        cfg = copy.deepcopy(base)
        for key, value in (("method", method), ("column", column), ("system.fraction", fraction)):
            OmegaConf.update(cfg, key, value, merge=False)
        r = OmegaConf.to_container(cfg, resolve=True)
        dataset, params, model, (partition, pparams), rounds, clients, lr, best_mu = COLUMNS[column]
        objective, mu, work_kept = METHODS[method]
        where = (method, column, fraction)
        assert r["dataset"]["_target_"] == dataset and params.items() <= r["dataset"].items(), where
        assert r["model"]["_target_"] == model and r["partition"]["_target_"] == partition, where
        assert pparams.items() <= r["partition"].items(), where
        assert (r["rounds"], r["num_clients"], r["clients_per_round"], r["eval_every"]) == (rounds, clients, 10, 1), where
        c = r["client"]
        assert (c["lr"], c["local_epochs"], c["batch_size"], c["momentum"], c["weight_decay"], c["schedule"]) == \
            (lr, 20, 10, 0.0, 0.0, "constant"), where  # P 5.1: E = 20, B = 10; P C.2: no decay
        assert c["objective"]["_target_"] == objective, where
        if objective.endswith("FedProx"):
            assert c["objective"]["mu"] == (best_mu if mu is None else mu), where
        assert r["aggregator"]["_target_"].endswith("FedAvg"), where  # the server of all three is FedAvg's
        s = r["system"]
        assert (s["_target_"], s["fraction"], s["work"], s["partial_work"]) == \
            ("fedagg.system.stragglers.Stragglers", fraction, "epochs_code", work_kept), where


def test_the_paper_csv_lists_both_figures_and_states_the_papers_claims():
    rows, _ = make_table.read_paper(ROOT / "paper_results" / "fedprox_figures.csv")
    assert {(r["method"], r["column"], r["stragglers"]) for r in rows} == FIGURE_1 | FIGURE_2
    assert all(r["paper"] in ("", None) for r in rows)  # curves: no number per cell
    text = (ROOT / "paper_results" / "fedprox_figures.csv").read_text().splitlines()[0]
    assert "with AND without stragglers" in text and "22%" in text and "drops the stragglers" in text
    assert "Sent140" in text and "NOT in fedagg" in text
    assert "close" not in text  # the old, wrong claim: "with 0% they are close"
