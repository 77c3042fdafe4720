"""`system=stragglers` as FedProx's authors ran it: whole epochs, and FedAvg that drops the stragglers.

The authors' round (litian96/FedProx@d2a4501), transcribed below in our own words:
- flearn/trainers/fedprox.py:49-51 and fedavg.py:29-31: of the K selected devices,
  round(K · (1 − drop_percent)) are drawn as active; the rest straggle;
- fedprox.py:57-71: every selected device trains and is aggregated; an active one runs
  num_epochs epochs, a straggler `np.random.randint(low=1, high=num_epochs)` epochs
  (fedprox.py:68; numpy's high is exclusive, so 1..E−1);
- fedavg.py:35-43: only the active devices train and are aggregated ("simply drop the slow devices");
- fedbase.py:115-120: the aggregate weighs each solution by its number of samples;
- flearn/models/synthetic/mclr.py:79-80 with flearn/utils/model_utils.py:21: an epoch is one pass in
  batches of B, the last one partial, so ⌈n/B⌉ steps.
"""

import csv
import json

import pytest
import torch

from conftest import compose_config
from fedagg.seeding import generator
from fedagg.run import train
from fedagg.system.stragglers import Stragglers


def authors_round(selected, sizes, drop_percent, epochs, active_draw, randint, keep_partial):
    """One round of the authors' trainers: [(device, epochs run, aggregation weight)] for the devices aggregated.
    `active_draw(selected, n)`: their np.random.choice; `randint(low, high)`: their np.random.randint."""
    active = active_draw(selected, round(len(selected) * (1 - drop_percent)))
    runs = []
    for c in (selected if keep_partial else active):  # FedProx loops over all selected, FedAvg over the active
        runs.append((c, epochs if c in active else randint(1, epochs)))
    total = sum(sizes[c] for c, _ in runs)
    return [(c, e, sizes[c] / total) for c, e in runs]


def _ours_as_authors(system, seed, r, selected, steps_per_epoch, epochs):
    """The same round from fedagg's system: who reports, and each reporter's whole epochs."""
    ids = system.reporting(seed, r, selected)
    full = [steps_per_epoch[c] * epochs for c in ids]
    budgets = system.budgets(seed, r, ids, full, epochs) or full
    assert all(b % steps_per_epoch[c] == 0 for c, b in zip(ids, budgets))  # whole epochs only
    return ids, [b // steps_per_epoch[c] for c, b in zip(ids, budgets)]


@pytest.mark.parametrize("fraction, stragglers", [(0.0, 0), (0.5, 5), (0.9, 9)])
def test_the_authors_straggler_rounds_at_their_three_fractions(fraction, stragglers):
    selected, epochs = list(range(100, 110)), 20
    sizes = {c: 7 + 3 * (c - 100) for c in selected}
    per_epoch = {c: -(-sizes[c] // 10) for c in selected}  # B = 10
    for r in range(1, 6):
        # our stream fixes which clients lag and the uniform draw behind each straggler's epochs; the authors' numpy
        # stream would pick other clients, not differently, so their round is fed these picks
        g = generator(0, "stragglers", r)
        lagging = torch.randperm(10, generator=g)[:stragglers].tolist()
        draws = torch.rand(10, generator=g).tolist()
        active_draw = lambda sel, n: [c for k, c in enumerate(sel) if k not in lagging][:n]  # noqa: E731
        for keep in (True, False):
            u = iter([draws[k] for k in range(10) if k in lagging])  # their loop meets the stragglers in order
            randint = lambda lo, hi: lo + int(next(u) * (hi - lo))  # noqa: E731  U{lo..hi-1}, as numpy's
            theirs = authors_round(selected, sizes, fraction, epochs, active_draw, randint, keep)
            system = Stragglers(fraction, work="epochs_code", partial_work="keep" if keep else "drop")
            ids, run_epochs = _ours_as_authors(system, 0, r, selected, per_epoch, epochs)
            assert ids == [c for c, _, _ in theirs]
            assert run_epochs == [e for _, e, _ in theirs]
            assert len(ids) == (10 if keep else 10 - stragglers)  # 10, or round(10 * (1 - p)) active
            assert sum(e < epochs for e in run_epochs) == (stragglers if keep else 0)


def test_code_epochs_never_reach_e_and_text_epochs_do():
    """Over 400 rounds of 9 stragglers in 10 with E = 20: the code's x covers exactly 1..19, the text's 1..20."""
    seen = {"epochs_code": set(), "epochs_text": set()}
    for work in seen:
        system = Stragglers(0.9, work=work)
        for r in range(1, 401):
            budgets = system.budgets(3, r, list(range(10)), [20 * 4] * 10, 20)  # 4 steps an epoch
            short = sum(b < 80 for b in budgets)
            assert short == 9 if work == "epochs_code" else short <= 9  # the text's x = E is a full round
            assert all(b % 4 == 0 for b in budgets)
            lagging = set(torch.randperm(10, generator=generator(3, "stragglers", r))[:9].tolist())
            seen[work] |= {budgets[k] // 4 for k in lagging}
    assert seen["epochs_code"] == set(range(1, 20))
    assert seen["epochs_text"] == set(range(1, 21))


def test_epoch_budgets_are_whole_epochs_of_each_clients_own_size():
    ids, epochs = [4, 9, 2, 7], 5
    per_epoch = [3, 1, 6, 2]
    full = [p * epochs for p in per_epoch]
    budgets = Stragglers(1.0, work="epochs_text").budgets(1, 2, ids, full, epochs)
    g = generator(1, "stragglers", 2)
    torch.randperm(4, generator=g)
    u = torch.rand(4, generator=g).tolist()
    assert budgets == [p * (1 + int(x * epochs)) for p, x in zip(per_epoch, u)]
    code = Stragglers(1.0, work="epochs_code").budgets(1, 2, ids, full, epochs)
    assert code == [p * (1 + int(x * (epochs - 1))) for p, x in zip(per_epoch, u)]


def test_steps_stays_the_default_and_drop_reports_the_same_others():
    assert Stragglers().work == "steps" and Stragglers().partial_work == "keep"
    ids = list(range(10))
    keep = Stragglers(0.5).budgets(5, 3, ids, [10] * 10)
    reporting = Stragglers(0.5, partial_work="drop").reporting(5, 3, ids)
    lagging = set(torch.randperm(10, generator=generator(5, "stragglers", 3))[:5].tolist())
    assert reporting == [i for i in ids if i not in lagging] and len(reporting) == 5
    assert Stragglers(0.5, partial_work="drop").budgets(5, 3, reporting, [10] * 5) is None  # the rest work in full
    assert Stragglers(0.5).reporting(5, 3, ids) == ids
    assert all(keep[k] == 10 for k in reporting)  # who reports under drop works in full under keep


def test_bad_values_and_e_of_one_are_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"system.work='epoch' is not allowed; .*steps.*epochs_code.*epochs_text"):
        Stragglers(work="epoch")
    with pytest.raises(ValueError, match=r"system.partial_work='discard' is not allowed; .*keep.*drop"):
        train(compose_config("rounds=1", "device=cpu", "system=stragglers", "system.partial_work=discard"), tmp_path / "a")
    with pytest.raises(ValueError, match=r"system.work=epochs_code is not allowed with client.local_epochs=1"):
        Stragglers(work="epochs_code").budgets(0, 1, [0, 1], [3, 3], 1)


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _per_epoch(run_dir, batch=32):
    sizes = {c["id"]: c["size"] for c in json.loads((run_dir / "partition.json").read_text())["clients"]}
    return {i: -(-n // batch) for i, n in sizes.items()}


@pytest.mark.parametrize("engine", ["sequential", "parallel"])
def test_in_a_run_fedavg_drops_the_stragglers_fedprox_keeps_whole_epochs(tmp_path, engine):
    """Six clients a round, half lagging, E = 3: kept stragglers run 1 or 2 whole epochs; dropped ones are absent
    and the rest share weights by their samples."""
    common = ("rounds=3", "device=cpu", "clients_per_round=6", "client.local_epochs=3", "system=stragglers",
              "system.work=epochs_code", f"engine={engine}")
    train(compose_config(*common, "system.partial_work=keep"), tmp_path / "keep")
    train(compose_config(*common, "system.partial_work=drop"), tmp_path / "drop")
    per_epoch = _per_epoch(tmp_path / "keep")
    keep, drop = _rows(tmp_path / "keep" / "weights.csv"), _rows(tmp_path / "drop" / "weights.csv")
    for r in (1, 2, 3):
        kept = [x for x in keep if int(x["round"]) == r]
        dropped = [x for x in drop if int(x["round"]) == r]
        assert len(kept) == 6 and len(dropped) == 3  # floor(0.5 * 6) stragglers
        epochs = {int(x["client"]): int(x["local_steps"]) / per_epoch[int(x["client"])] for x in kept}
        assert sorted(e for e in epochs.values() if e < 3) in ([1, 1, 1], [1, 1, 2], [1, 2, 2], [2, 2, 2])
        assert sum(e == 3 for e in epochs.values()) == 3
        full = sorted(c for c, e in epochs.items() if e == 3)
        assert sorted(int(x["client"]) for x in dropped) == full  # the same stragglers, now absent
        assert all(int(x["local_steps"]) == 3 * per_epoch[int(x["client"])] for x in dropped)
        n = torch.tensor([float(x["num_samples"]) for x in dropped])
        assert torch.allclose(torch.tensor([float(x["weight"]) for x in dropped]), n / n.sum(), atol=1e-6)
