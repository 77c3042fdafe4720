"""Each method's trials in an Optuna study, stored in SQLite in the protocol folder so that a killed protocol
resumes: finished trials keep their scores, and a trial asked but not finished is run again with the values it
was given (its run folder resumes from its checkpoint).

Every method gets the same design, fixed before any score is seen: trial 0 is the method's defaults (its YAML's
values, or the command line's), trial n >= 1 the (n-1)-th point of a scrambled Sobol sequence, seeded by
`sampler_seed` (the same unit points for every method of as many dimensions), mapped into the method's own ranges
(log ranges in log space). Selection takes the best, so no method is tuned into something worse on validation than
its defaults. A trial's values depend only on its number: a grown budget continues the same sequence (budget 8 on
a folder of budget 4 asks exactly the 4 trials a budget of 8 would have asked after the first 4), a resumed study
asks what an uninterrupted one asked, and waves of `batch` trials change nothing. Sobol: every prefix of 2^m of its
points puts one value in each of 2^m equal parts of every range, so a budget cut short still spreads its trials.

Each trial's values are enqueued (`Study.enqueue_trial`), which stores them with the trial in one write. Optuna's
QMCSampler draws the same kind of points, but keeps its place in the sequence as a counter in the study's storage
that it advances before the trial's values are written (its own comment: each point is drawn "at least once"): a
kill between the two skips a point, and the resumed comparison would no longer equal an uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState
from scipy.stats import qmc

from fedagg.compare.space import Param, point

optuna.logging.set_verbosity(logging.WARNING)
DESIGN = "defaults, then scrambled Sobol points"  # recorded in protocol.json: a folder tuned otherwise is not grown


def open_study(path: Path | optuna.storages.BaseStorage, method: str) -> optuna.Study:
    """The method's study in the SQLite file `path` (or in a storage object: a test's in-memory one)."""
    storage = path if isinstance(path, optuna.storages.BaseStorage) else f"sqlite:///{path}"
    return optuna.create_study(study_name=method, storage=storage, direction="maximize", load_if_exists=True,
                               sampler=optuna.samplers.RandomSampler(seed=0))  # never draws: every value is enqueued


def unit_point(dimensions: int, index: int, seed: int) -> np.ndarray:
    """The `index`-th point (from 0) of the scrambled Sobol sequence in [0, 1)^dimensions seeded by `seed`."""
    rng = np.random.default_rng(seed)  # a Generator: the same draws whatever scipy's seeding rules
    engine = qmc.Sobol(dimensions, scramble=True, seed=rng)
    if index:  # (scipy refuses to skip 0 points)
        engine.fast_forward(index)
    return engine.random(1)[0]


def trial_values(space: list[Param], number: int, seed: int) -> dict:
    """Trial `number`'s values: the defaults for trial 0, else Sobol point number-1 in the space's ranges."""
    if number == 0:
        return {p.key: p.default for p in space}
    return {p.key: point(p, float(u)) for p, u in zip(space, unit_point(len(space), number - 1, seed))}


def _suggest(trial: optuna.Trial, space: list[Param]) -> dict:
    """The trial's values, all of them enqueued (a default outside its range too: Optuna warns, and runs it)."""
    out = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Fixed parameter", category=UserWarning)
        for p in space:
            t = p.tune
            if t.integer:
                out[p.key] = trial.suggest_int(p.key, math.ceil(t.low), math.floor(t.high), log=t.log)
            else:
                out[p.key] = trial.suggest_float(p.key, t.low, t.high, log=t.log)
    return out


def next_trials(study: optuna.Study, space: list[Param], budget: int, batch: int, seed: int) -> list[tuple[int, dict]]:
    """The next wave of (number, values) to run: after a kill, the trials asked but never told (their runs
    resume), alone; else up to `batch` new trials while the method has fewer than `budget`."""
    trials = study.get_trials(deepcopy=False)
    running = [t for t in trials if t.state == TrialState.RUNNING]
    if running:
        return [(t.number, _suggest(optuna.Trial(study, t._trial_id), space)) for t in running]
    out, total = [], len(trials)
    while total < budget and len(out) < batch:
        if not any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False)):
            study.enqueue_trial(trial_values(space, total, seed))  # (one left WAITING by a kill: its values already)
        trial = study.ask()
        out.append((trial.number, _suggest(trial, space)))
        total += 1
    return out


def tell(study: optuna.Study, number: int, value: float) -> None:
    trial = study.get_trials(deepcopy=False)[number]
    if trial.state == TrialState.RUNNING:  # told already when a kill came after the tell
        study.tell(number, value)


def finished(study: optuna.Study) -> list[dict]:
    """{trial, params, val_score} of the told trials, by number."""
    return [{"trial": t.number, "params": dict(t.params), "val_score": t.value}
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
