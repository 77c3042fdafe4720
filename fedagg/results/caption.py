"""A table's caption in words, so that the LaTeX a paper includes says what was run without the reader opening
a folder: the setting every run shares (dataset, partition, clients, rounds, server), the metric and the window it
averages, and for a comparison its protocol (budget, validation share, tuning and confirm seeds)."""

from __future__ import annotations

from fedagg.results.derived import LAST_K
from fedagg.results.values import TO_TARGET, key_text, lookup, number

DATASETS = {"mnist": "MNIST", "fmnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
            "cifar100_fl": "CIFAR-100 (TFF's clients)", "femnist": "FEMNIST", "femnist_fedprox": "FEMNIST (FedProx's)",
            "digits": "Digits (8×8)", "shakespeare": "Shakespeare", "synthetic": "Synthetic", "imagenet": "ImageNet",
            "tinyimagenet": "Tiny ImageNet"}
PARTITIONS = {"iid": "IID", "dirichlet": "Dirichlet", "n_class": "n-class", "shards": "shards",
              "natural": "natural", "power_law": "power-law", "quantity_skew": "quantity-skew",
              "feature_skew": "feature-skew", "pachinko": "Pachinko", "mixed": "mixed"}
SYMBOLS = {"alpha": "α", "beta": "β"}
NOT_WORDS = ("_target_", "_partial_", "min_size", "max_retries", "display_name")  # how, not what, a partition is


def _partition(choice: str, params: dict) -> str:
    shown = [f"{SYMBOLS.get(k, k.replace('_', ' '))} = {key_text(v)}" for k, v in params.items()
             if k not in NOT_WORDS and v is not None and not isinstance(v, (dict, list))]
    return f"{PARTITIONS.get(choice, choice)} partition" + (f" ({', '.join(shown)})" if shown else "")


def _clients(run: dict) -> str | None:
    config = run.get("config") or {}
    n, k = config.get("num_clients"), config.get("clients_per_round")
    if n is None:
        return None
    if (run.get("choices") or {}).get("server") == "async":  # no rounds of clients: the server says how many fly
        return f"{n} clients"
    return f"{n} clients" + (f", {k} per round" if k not in (None, n) else ", all in every round")


def _server(run: dict) -> str | None:
    choices = run.get("choices") or {}
    if choices.get("server") == "async":
        c = lookup(run, "config.server.concurrency")
        return f"asynchronous server ({c} clients in flight), {choices.get('clock')} clock"
    return f"{choices['clock']} clock" if choices.get("clock") not in (None, "none") else None


def _rounds(run: dict) -> str | None:
    r = lookup(run, "config.rounds")
    if r is None:
        return None
    steps = "server steps" if (run.get("choices") or {}).get("server") == "async" else "rounds"
    return f"{r} {steps}"


def setting_words(runs: list[dict]) -> str:
    """What every run shares, in words: `Digits (8×8), Dirichlet partition (α = 0.5), 6 clients, all in every round,
    3 rounds`. A part that differs between runs is left out: the table's header shows it."""
    parts = []
    for word in (lambda r: DATASETS.get(d, d) if (d := (r.get("choices") or {}).get("dataset")) else None,
                 lambda r: _partition(p, lookup(r, "config.partition") or {}) if (p := (r.get("choices") or {}).get(
                     "partition")) else None,
                 _clients, _rounds, _server,
                 lambda r: f"model {str(m).rsplit('.', 1)[-1]}" if (m := lookup(r, "config.model._target_")) else None):
        seen = {word(r) for r in runs}
        if len(seen) == 1 and (only := seen.pop()):
            parts.append(only)
    return ", ".join(parts)


def targets(runs: list[dict]) -> list[float]:
    return sorted({t for r in runs if (t := number(r.get("target_acc"))) is not None})


def percent(value: float) -> str:
    return f"{100 * value:g}%"


def metric_words(spec: dict, runs: list[dict]) -> str:
    """The metric and its window: `test accuracy (%) averaged over the last k = 1 evaluated round of 3 (k = ⌈R/10⌉)`."""
    metric = spec["metric"]
    if metric == LAST_K:
        ks = sorted({run["last_k"] for run in runs if "last_k" in run})
        rounds = sorted({int(r) for run in runs if (r := number(run.get("rounds_completed"))) is not None})
        every = sorted({int(e) for run in runs if (e := number(lookup(run, "config.eval_every"))) is not None})
        k = "/".join(map(str, ks)) or "?"
        of = f" of {'/'.join(map(str, rounds))}" if rounds else ""
        evaluated = f", evaluated every {every[0]} rounds" if every and every != [1] else ""
        plural = "s" if ks != [1] else ""
        windows = sorted({run["last_rounds"] for run in runs if "last_rounds" in run})
        if windows:  # the table's window in rounds (table.last_rounds), as its authors measured it
            return (f"Test accuracy averaged over the last {'/'.join(map(str, windows))} rounds (k = {k} evaluated "
                    f"round{plural}{of}{evaluated})")
        return (f"Test accuracy (%) averaged over the last k = {k} evaluated round{plural}{of} "
                f"(k = ⌈R/10⌉{evaluated})")
    if metric in TO_TARGET:
        goal = ", ".join(map(percent, targets(runs))) or "the target"
        if metric == "rounds_to_target":
            return f"Rounds to reach a test accuracy of {goal} (the first evaluated round that does)"
        return (f"Simulated seconds to reach a test accuracy of {goal} (the clock's sim_time at the end of the first "
                f"evaluated server step that does)")
    return {"final_test_acc": "Test accuracy (%) after the last round",
            "best_test_acc": "Best test accuracy (%) over the rounds (selected on the test set)"}.get(metric, metric)


def protocol_words(protocol: dict) -> str:
    """A comparison's protocol: `each method tuned with 8 trials on tuning seed 0, scored on a validation share of 10%
    of every client's data; its chosen and its default configuration confirmed on the test set, seeds 1, 2`."""
    if not protocol:
        return ""
    seeds = protocol.get("tune_seeds") or []
    scored = (f"a validation share of {percent(protocol.get('val_frac', 0))} of every client's data"
              if protocol.get("validation", "split") == "split"
              else f"{percent(protocol.get('held_out', 0))} of the clients held out (never trained on)")
    confirm = protocol.get("confirm_seeds") or []
    return (f"Protocol: each method tuned with a budget of {protocol.get('budget')} trials on tuning seed"
            f"{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}, scored on {scored}; its chosen and its "
            f"default configuration confirmed on the test set on seed{'s' if len(confirm) > 1 else ''} "
            f"{', '.join(map(str, confirm))}")


def value_title(spec: dict) -> str:
    """The header over the measured values: `Acc. (%)`, `Time to 80% (s)`, `Rounds to 80%`."""
    metric = spec["metric"]
    goal = "/".join(percent(t) for t in spec.get("targets") or []) or "target"
    if metric == "time_to_target":
        return f"Time to {goal} (s)"
    if metric == "rounds_to_target":
        return f"Rounds to {goal}"
    if spec.get("percent") and (metric.endswith("_acc") or "_acc_" in metric):
        return "Acc. (%)"
    return metric + (" (%)" if spec.get("percent") else "")


def words(runs: list[dict], spec: dict, protocol: dict | None) -> dict:
    """What a table's spec carries for its caption and header."""
    return {"setting_words": setting_words(runs), "metric_words": metric_words(spec, runs),
            "protocol_words": protocol_words(protocol or {}), "targets": targets(runs)}


__all__ = ["words", "value_title", "setting_words", "metric_words", "protocol_words"]
