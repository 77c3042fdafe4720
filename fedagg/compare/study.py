"""Each method's trials in an Optuna study, stored in SQLite in the protocol folder so that a killed protocol
resumes: finished trials keep their scores, and a trial asked but not finished is run again with the values it
was given (its run folder resumes from its checkpoint).

The sampler is made afresh, seeded by the trial's number, before each trial is asked: a trial's values then
depend only on the trials finished before it and on its number, never on what this process asked earlier, so a
resumed protocol asks what an uninterrupted one asked. A one-dimensional float space is searched on a grid of
exactly `budget` points through the method's default. A larger one starts with a space-filling design (scrambled
Sobol points, the same for every method of as many dimensions), enqueued one trial at a time like the grid, then
TPE. Left to the freshly seeded samplers, the first trials are the first draws of consecutive seeds, which may
lie close together (RandomState(0..3), sampler_seed 0's, all start within 0.42-0.55): every method's first trials
bunched in the middle of its ranges, and a small budget explored nothing.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState
from scipy.stats import qmc

from fedagg.compare.space import Param, grid, point

optuna.logging.set_verbosity(logging.WARNING)


def open_study(path: Path | optuna.storages.BaseStorage, method: str) -> optuna.Study:
    """The method's study in the SQLite file `path` (or in a storage object: a test's in-memory one)."""
    storage = path if isinstance(path, optuna.storages.BaseStorage) else f"sqlite:///{path}"
    return optuna.create_study(study_name=method, storage=storage, direction="maximize", load_if_exists=True)


def on_grid(space: list[Param]) -> bool:
    return len(space) == 1 and not space[0].tune.integer


def design_size(budget: int) -> int:
    """How many of a method's first trials are the design, before TPE. TPE splits the trials it has seen into a
    good and a bad group and samples where the good ones' density is high; from four trials or fewer that split
    says little, so a budget of 4 or less is all design. Beyond that a third of the budget explores (the rest is
    TPE's to exploit), and never fewer than 4 trials: Sobol's first four points put one value in each quarter of
    every range."""
    return budget if budget <= 4 else max(4, math.ceil(budget / 3))


def design(space: list[Param], size: int, seed: int) -> list[dict]:
    """The first `size` points of the scrambled Sobol sequence of the space's dimension, seeded by `seed`, as
    values (log ranges in log space, integer ones rounded). Every prefix of 2^m points puts one value in each of
    2^m equal parts of every range, so a design cut short still covers each range evenly."""
    rng = np.random.default_rng(seed)  # a Generator: the same draws whatever scipy's seeding rules
    unit = qmc.Sobol(len(space), scramble=True, seed=rng).random_base2(math.ceil(math.log2(size)))[:size]
    return [{p.key: point(p, float(u)) for p, u in zip(space, row)} for row in unit]


def _sampler(space: list[Param], budget: int, number: int, seed: int) -> optuna.samplers.BaseSampler:
    s = seed * 1_000_003 + number
    if on_grid(space) or not space:
        return optuna.samplers.RandomSampler(seed=s)  # the grid's values are enqueued; nothing is drawn
    return optuna.samplers.TPESampler(seed=s, n_startup_trials=design_size(budget))  # after the enqueued design


def _suggest(trial: optuna.Trial, space: list[Param]) -> dict:
    """The trial's values (those it was given before, for a trial asked earlier)."""
    out = {}
    for p in space:
        t = p.tune
        if t.integer:
            out[p.key] = trial.suggest_int(p.key, math.ceil(t.low), math.floor(t.high), log=t.log)
        else:
            out[p.key] = trial.suggest_float(p.key, t.low, t.high, log=t.log)
    return out


def next_trials(study: optuna.Study, space: list[Param], budget: int, batch: int, seed: int) -> list[tuple[int, dict]]:
    """The next wave of (number, values) to run: up to `batch` new trials while the method has fewer than
    `budget`, all asked from the same finished trials. After a kill, first the trials asked but never told
    (their runs resume), alone: trials asked after them would otherwise see a history an uninterrupted
    protocol never showed them."""
    trials = study.get_trials(deepcopy=False)
    total, out = len(trials), []
    for t in [t for t in trials if t.state == TrialState.RUNNING]:
        study.sampler = _sampler(space, budget, t.number, seed)
        out.append((t.number, _suggest(optuna.Trial(study, t._trial_id), space)))
    if out:
        start = (total - 1) // batch * batch  # the interrupted wave's first trial
        if total % batch == 0 or any(t.state == TrialState.COMPLETE for t in trials[start:]):
            return out  # the wave was fully asked (or already partly told): run what it left open
        end = min(start + batch, budget)  # killed between two asks: finish the wave from the same history
    else:
        end = min(total + batch, budget)
    while total < end:
        study.sampler = _sampler(space, budget, total, seed)
        waiting = any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False))
        if on_grid(space) and not waiting:  # (one left WAITING by a kill between these two calls is taken as it is)
            study.enqueue_trial({space[0].key: grid(space[0], budget)[total]})
        elif space and total < design_size(budget) and not waiting:
            study.enqueue_trial(design(space, design_size(budget), seed)[total])
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
