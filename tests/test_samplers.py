"""Client selection (`sampler` group): uniform is the stream runs always had; size-proportional draws in proportion
to n_k; Power-of-Choice trains the highest-loss of d candidates; clustered sampling (Fraboni et al. 2021,
Algorithm 1) draws one client from each of k size-based groups. Against hand-computed cases, exact small-case
probabilities, transcriptions of the authors' code, and a real run; and the one-line refusals."""

import csv
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import chisquare

from conftest import compose_config
from fedagg.config.settings import Settings
from fedagg.sampling.pool import sample_clients, sampling_pool
from fedagg.seeding import generator
from fedagg.edge.job_checks import SetupError
from fedagg.models.flat import set_params
from fedagg.run import prepare, run_experiment
from fedagg.runtime.interrupts import StopRequests
from fedagg.runtime.progress import RoundProgress
from fedagg.sampling.base import Draw, Sampler, proportional
from fedagg.sampling.clustered import Clustered, clusters
from fedagg.sampling.power_of_choice import PowerOfChoice
from fedagg.sampling.size import SizeProportional


def old_sample_clients(settings, round, online=None):
    """`sample_clients` as it was before samplers existed (fedagg/config/settings.py at dfddfc4)."""
    pool = sampling_pool(settings, online)
    if settings.per_round >= len(pool):
        return pool.tolist()
    g = generator(settings.seed, "sampling", round)
    return sorted(pool[torch.randperm(len(pool), generator=g)[: settings.per_round]].tolist())


@pytest.mark.parametrize("seed,n,k,held_out", [(0, 10, 5, 0.0), (3, 20, 4, 0.0), (1, 12, 3, 0.25), (7, 6, 6, 0.0)])
def test_uniform_is_the_old_stream(seed, n, k, held_out):
    settings = Settings(seed=seed, num_clients=n, clients_per_round=k, held_out=held_out)
    online = torch.rand(n, generator=torch.Generator().manual_seed(seed)) < 0.7
    for r in range(1, 9):
        for mask in (None, online):
            old = old_sample_clients(settings, r, mask)
            pool = sampling_pool(settings, mask)
            assert Sampler().choose(k, pool, r, Draw(seed, torch.ones(n, dtype=torch.long))) == old
            assert sample_clients(settings, r, mask) == old


def successive_pair_probabilities(sizes):
    """P({a, b}) of two draws without replacement, each ∝ the sizes left: p_a p_b / (1 - p_a) + p_b p_a / (1 - p_b)."""
    p = np.asarray(sizes, dtype=float) / sum(sizes)
    return {(a, b): p[a] * p[b] / (1 - p[a]) + p[b] * p[a] / (1 - p[b])
            for a, b in itertools.combinations(range(len(sizes)), 2)}


def test_the_pair_probabilities_by_hand():
    probs = successive_pair_probabilities([1, 2, 3, 4])
    assert probs[(2, 3)] == pytest.approx(0.3 * 0.4 / 0.7 + 0.4 * 0.3 / 0.6)  # 0.3714
    assert probs[(0, 1)] == pytest.approx(0.1 * 0.2 / 0.9 + 0.2 * 0.1 / 0.8)  # 0.0472
    assert sum(probs.values()) == pytest.approx(1.0)


def pair_counts(draw_pair, sizes, trials):
    counts = dict.fromkeys(itertools.combinations(range(len(sizes)), 2), 0)
    for t in range(trials):
        counts[tuple(sorted(draw_pair(t)))] += 1
    return np.array(list(counts.values()))


def test_size_proportional_pairs_have_the_exact_probabilities_and_uniform_ones_do_not():
    sizes, trials = [1, 2, 3, 4], 6000
    expected = np.array(list(successive_pair_probabilities(sizes).values())) * trials
    draw = Draw(0, torch.tensor(sizes))
    pool = torch.arange(4)
    ours = pair_counts(lambda t: SizeProportional().choose(2, pool, t + 1, draw), sizes, trials)
    assert chisquare(ours, expected).pvalue > 1e-3
    uniform = pair_counts(lambda t: Sampler().choose(2, pool, t + 1, draw), sizes, trials)
    assert chisquare(uniform, expected).pvalue < 1e-12  # the check tells the two rules apart
    # the authors' candidate draw, np.random.choice(N, p=n_k / n, size=d, replace=False), fits the same counts
    rng = np.random.default_rng(0)
    theirs = pair_counts(lambda t: rng.choice(4, p=np.array(sizes) / 10, size=2, replace=False), sizes, trials)
    assert chisquare(theirs, expected).pvalue > 1e-3


def test_a_client_without_data_is_never_drawn_in_proportion():
    ids = torch.tensor([4, 5, 6, 7])
    for step in range(1, 30):
        got = proportional(ids, torch.tensor([0, 3, 0, 1]), 3, generator(0, "sampling", step))
        assert sorted(got.tolist()) == [5, 7]  # only two hold data: fewer than k come back


class FixedLosses:
    """A table of losses by client id, in place of the global model's; records what it was asked."""

    def __init__(self, table):
        self.table, self.asked = torch.tensor(table, dtype=torch.float64), []

    def __call__(self, ids, samples=None, generator=None):
        self.asked.append((ids.tolist(), samples))
        return self.table[ids]


def test_power_of_choice_trains_the_largest_losses_of_its_candidates_by_hand():
    # clients 0 and 1 hold no data, so the 3 candidates (∝ n_k) are 2, 3, 4 whatever the stream draws
    losses = FixedLosses([9.0, 9.0, 0.1, 0.9, 0.5])
    draw = Draw(0, torch.tensor([0, 0, 5, 5, 5]), losses)
    for step in (2, 3, 4):
        assert PowerOfChoice(d=3).choose(2, torch.arange(5), step, draw) == [3, 4]
    assert all(sorted(ids) == [2, 3, 4] and samples is None for ids, samples in losses.asked)
    assert PowerOfChoice(d=3, samples=7).choose(1, torch.arange(5), 2, draw) == [3]
    assert losses.asked[-1][1] == 7


def test_power_of_choice_on_fixed_losses_with_drawn_candidates():
    sizes = torch.tensor([10, 40, 20, 30, 50, 25, 35, 45])
    losses = FixedLosses([0.3, 0.1, 0.8, 0.4, 0.2, 0.9, 0.5, 0.6])
    draw, pool = Draw(5, sizes, losses), torch.arange(8)
    for step in range(2, 12):
        candidates = proportional(pool, sizes.double(), 6, generator(5, "sampling", step))  # d = 6, m = 3
        assert len(set(candidates.tolist())) == 6
        by_loss = sorted(candidates.tolist(), key=lambda i: -losses.table[i])
        assert PowerOfChoice(d=6).choose(3, pool, step, draw) == sorted(by_loss[:3])
        assert PowerOfChoice().choose(3, pool, step, draw) == sorted(by_loss[:3])  # null: d = 2m = 6
        # d = m: every candidate trains, which is the size-proportional draw
        assert PowerOfChoice(d=3).choose(3, pool, step, draw) == SizeProportional().choose(3, pool, step, draw)


def test_power_of_choice_draws_its_first_round_uniformly_without_scoring():
    losses = FixedLosses([1.0] * 8)
    draw = Draw(2, torch.tensor([1, 1, 1, 1, 1, 1, 1, 100]), losses)
    assert PowerOfChoice(d=6).choose(3, torch.arange(8), 1, draw) == Sampler().choose(3, torch.arange(8), 1, draw)
    assert losses.asked == []


def authors_pow_d(data_ratios, cli_loss, ensize, powd, size, random):
    """The authors' pow-d selection, as written in peng-ju/Power-of-Choice@8c857a2:
    image_classification/deprecated/original_implementation/1776-supp/code/dnn/util_v4.py:305-311 (`np.random` is
    passed in as `random`, so the candidates can be the ones fedagg drew)."""
    rnd_idx = random.choice(ensize, p=data_ratios, size=powd, replace=False)
    repval = list(zip([cli_loss[i] for i in rnd_idx], rnd_idx))
    repval.sort(key=lambda x: x[0], reverse=True)
    rep = list(zip(*repval))
    idxs_users = rep[1][:int(size)]
    return idxs_users


class GivenCandidates:
    """np.random for the transcription: returns fedagg's candidates, after checking it was asked what fedagg drew."""

    def __init__(self, candidates, sizes):
        self.candidates, self.sizes = candidates, sizes

    def choice(self, n, p, size, replace):
        assert n == len(self.sizes) and size == len(self.candidates) and replace is False
        assert np.allclose(p, self.sizes / self.sizes.sum())
        return self.candidates


def test_power_of_choice_chooses_as_the_authors_code():
    rng = np.random.default_rng(1)
    for trial in range(200):
        n, m = int(rng.integers(4, 30)), int(rng.integers(1, 4))
        d = int(rng.integers(m, min(n, 3 * m) + 1))
        sizes = rng.integers(1, 100, n)
        loss = np.round(rng.random(n), 1)  # one decimal: many ties, which both break by the order drawn
        draw = Draw(trial, torch.tensor(sizes), FixedLosses(loss.tolist()))
        sampler = PowerOfChoice(d=d)
        candidates = sampler.candidates(m, torch.arange(n), 2, draw).numpy()
        theirs = authors_pow_d(sizes / sizes.sum(), loss, n, d, m, GivenCandidates(candidates, sizes))
        ours = sampler.select(m, torch.arange(n), 2, draw).tolist()
        assert ours == [int(i) for i in theirs]  # the same clients, in the same order


def authors_alg1(n_sampled, weights):
    """Clustered sampling's Algorithm 1 as written in
    Accenture/Labs-Federated-Learning@47c17fe3127add058f3a47115163db962cf1564a:py_func/clustering.py:11-42."""
    epsilon = int(10 ** 10)
    augmented_weights = np.array([w * n_sampled * epsilon for w in weights])
    ordered_client_idx = np.flip(np.argsort(augmented_weights))
    n_clients = len(weights)
    distri_clusters = np.zeros((n_sampled, n_clients)).astype(int)
    k = 0
    for client_idx in ordered_client_idx:
        while augmented_weights[client_idx] > 0:
            sum_proba_in_k = np.sum(distri_clusters[k])
            u_i = min(epsilon - sum_proba_in_k, augmented_weights[client_idx])
            distri_clusters[k, client_idx] = u_i
            augmented_weights[client_idx] += -u_i
            sum_proba_in_k = np.sum(distri_clusters[k])
            if sum_proba_in_k == 1 * epsilon:
                k += 1
    distri_clusters = distri_clusters.astype(float)
    for l in range(n_sampled):
        distri_clusters[l] /= np.sum(distri_clusters[l])
    return distri_clusters


def test_clusters_by_hand():
    # masses k n_i = 8, 6, 4, 2 laid down in intervals of Σn = 10: [8 of client 0, 2 of client 1], [4, 4, 2]
    got = clusters(torch.tensor([4, 3, 2, 1]), 2)
    assert torch.equal(got, torch.tensor([[0.8, 0.2, 0.0, 0.0], [0.0, 0.4, 0.4, 0.2]], dtype=torch.float64))


def test_clusters_are_the_authors_algorithm_1():
    rng = np.random.default_rng(2)
    for trial in range(100):
        n = int(rng.integers(2, 40))
        k = int(rng.integers(1, n + 1))
        sizes = rng.permutation(np.arange(1, 200))[:n]  # distinct: the order of the clients is the sizes' alone
        theirs = authors_alg1(k, sizes / sizes.sum())
        assert np.allclose(clusters(torch.tensor(sizes), k).numpy(), theirs, atol=1e-8), (sizes, k)


def test_clusters_with_equal_sizes_are_the_authors_up_to_the_order_of_ties():
    """numpy's argsort leaves the order of equal weights to its sort (vectorised ones reorder them): the clusters
    agree in what each client is drawn in expectation (k p_i) and in each cluster's masses."""
    rng = np.random.default_rng(3)
    for trial in range(100):
        n = int(rng.integers(2, 30))
        k = int(rng.integers(1, n + 1))
        sizes = rng.integers(1, 6, n)
        sizes[-1] += 2 ** int(np.ceil(np.log2(sizes.sum()))) - sizes.sum()  # Σn a power of 2: their float
        # masses w k 1e10 are then whole numbers (else a residue can overrun the last cluster in their loop)
        ours, theirs = clusters(torch.tensor(sizes), k).numpy(), authors_alg1(k, sizes / sizes.sum())
        assert np.allclose(ours.sum(0), k * sizes / sizes.sum()) and np.allclose(ours.sum(0), theirs.sum(0))
        assert np.allclose(np.sort(ours, 1), np.sort(theirs, 1), atol=1e-8)


def test_clustered_sampling_draws_one_client_from_each_cluster():
    # client 0 fills the first cluster alone; the second holds clients 1..5 at 1/5 each
    sizes = torch.tensor([7] * 10 + [5, 1, 1, 1, 1, 1])  # ids 10..15 of 16; 0..9 are not in the pool
    draw, pool, trials = Draw(0, sizes), torch.arange(10, 16), 2000
    counts = np.zeros(5)
    for step in range(1, trials + 1):
        chosen = Clustered().choose(2, pool, step, draw)
        assert len(chosen) == 2 and chosen[0] == 10
        counts[chosen[1] - 11] += 1
    assert chisquare(counts, np.full(5, trials / 5)).pvalue > 1e-3
    # a client whose mass spans two clusters may be drawn by both: it trains once
    # (masses k n_i = 4, 4, 2, 2 laid down 1, 0, 3, 2 (ties: the later id first) in intervals of 6: client 0
    # holds 2 of each, so both draw it with chance 1/9)
    seen = [Clustered().choose(2, torch.arange(4), s, Draw(0, torch.tensor([2, 2, 1, 1]))) for s in range(1, 100)]
    assert [0] in seen and all(len(c) == 2 or c == [0] for c in seen)


def rounds_in(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return {r: sorted(int(x["client"]) for x in rows if int(x["round"]) == r) for r in {int(x["round"]) for x in rows}}


def test_a_run_trains_the_candidates_with_the_largest_losses(tmp_path):
    """A digits run with sampler=power_of_choice: round 1 is uniform's; round 2 trains the 3 of the 6 candidates
    with the largest loss of the model round 1 made, computed here by hand on each one's whole training split."""
    cfg = compose_config("rounds=2", "device=cpu", "num_clients=12", "clients_per_round=3", "sampler=power_of_choice",
                         "sampler.d=6", "seed=4")
    with prepare(cfg, tmp_path) as run, StopRequests() as stop:
        loop, fed = run.loop, run.loop.fed
        loop.start(stop, RoundProgress(1, 2, bar=False))
        plan = loop.begin(1)
        loop.end(plan, fed.engine.train_round(plan.job))
        sizes = torch.tensor([c.train_idx.numel() for c in fed.clients])
        candidates = PowerOfChoice(d=6).candidates(3, torch.arange(12), 2, Draw(4, sizes))
        set_params(fed.model, loop.params)
        fed.model.eval()
        with torch.no_grad():
            by_hand = torch.tensor([float(F.cross_entropy(fed.model(fed.data.prepare(fed.data.train_images(idx))),
                                                          fed.data.train_y[idx]))
                                    for idx in (fed.clients[i].train_idx for i in candidates.tolist())])
        expected = sorted(candidates[by_hand.argsort(descending=True)[:3]].tolist())
        assert torch.allclose(loop.client_losses(candidates), by_hand.double(), rtol=1e-5)
        # cpow-d: b samples of each, drawn in candidate order from the generator given
        part = [fed.clients[i].train_idx for i in candidates.tolist()]
        g = generator(4, "sampling_losses", 2)
        subsets = [idx[torch.randperm(idx.numel(), generator=g)[:5]] for idx in part]
        with torch.no_grad():
            few = [float(F.cross_entropy(fed.model(fed.data.prepare(fed.data.train_images(s))), fed.data.train_y[s]))
                   for s in subsets]
        got = loop.client_losses(candidates, 5, generator(4, "sampling_losses", 2))
        assert torch.allclose(got, torch.tensor(few, dtype=torch.float64), rtol=1e-5)
        assert not torch.allclose(got, by_hand.double(), rtol=1e-3)  # 5 samples are not the whole split
        plan = loop.begin(2)
        loop.end(plan, fed.engine.train_round(plan.job))
        assert loop.complete()["status"] == "completed"
    chosen = rounds_in(tmp_path / "weights.csv")
    assert chosen[1] == sample_clients(Settings(seed=4, num_clients=12, clients_per_round=3), 1)
    assert chosen[2] == expected


@pytest.mark.parametrize("overrides,line", [
    (["sampler=size", "channel=dp"], "channel=dp is not allowed with sampler=size: the privacy accountant's q = K / "
     "pool assumes every client is sampled uniformly at random each round, which this sampler does not do; use "
     "sampler=uniform"),
    (["sampler=power_of_choice", "sampler.d=2"], "sampler.d=2 is not allowed with clients_per_round=3: "
     "Power-of-Choice trains the 3 highest-loss of d candidates, so d must be at least clients_per_round "
     "(null: 2 x clients_per_round)"),
    (["sampler=power_of_choice", "sampler.d=10", "eval.held_out_clients=0.25"], "sampler.d=10 is not allowed: "
     "only 9 clients can be sampled (num_clients less eval.held_out_clients), so d must be at most 9"),
    (["sampler=power_of_choice", "sampler.samples=0"], "sampler.samples=0 is not allowed; it must be an integer >= 1, "
     "or null"),
])
def test_what_a_sampler_cannot_do_is_one_line_before_training(tmp_path, overrides, line):
    with pytest.raises(SetupError) as err:
        run_experiment(["rounds=2", "device=cpu", "num_clients=12", "clients_per_round=3", *overrides], tmp_path)
    assert str(err.value) == line
    assert not (tmp_path / "metrics.csv").exists()


def test_the_choice_is_recorded(tmp_path):
    summary = run_experiment(["rounds=1", "device=cpu", "num_clients=6", "clients_per_round=2", "sampler=clustered"],
                             tmp_path)
    assert summary["choices"]["sampler"] == "clustered"
