"""Assemble a federation from instantiated parts: connect them, split the data, build the model.

`assemble` is the one wiring of a run, used by `fedagg.run` (the Hydra edge), by
`scripts/bench.py` and by the tests. It is plain Python: the parts may come from Hydra's
`instantiate` or be constructed by hand.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from fedagg.aggregators.base import Aggregator
from fedagg.aggregators.inputs import ClientSetup, Needs
from fedagg.channel.base import Rule, Setup
from fedagg.channel.chain import Channel
from fedagg.data.device import DeviceData
from fedagg.data.natural import natural as natural_partition, own_test_splits, split_pool, takes_owners
from fedagg.data.partition_report import partition_stats
from fedagg.engines.choice import RoundShape, model_kind
from fedagg.seeding import generator
from fedagg.loop.federation import Federation, Parts  # noqa: F401  (Parts: where callers find it)
from fedagg.loop.inputs import check_needs
from fedagg.loop.server import Synchronous
from fedagg.config.settings import Settings
from fedagg.loop.splits import build_model, hold_out_server_split, make_clients, shrink
from fedagg.models.adapters import NoAdapter
from fedagg.models.adapters.masks import RankMasks
from fedagg.models.base import Backbone

DEFAULT_VAL_FRAC, DEFAULT_TEST_FRAC = 0.1, 0.2
log = logging.getLogger("fedagg")


def connect(parts: Parts, settings: Settings) -> None:
    """Give local training the aggregator's client half; let the aggregator and the engine refuse what they
    cannot run. Needs no data, so a bad combination is refused before anything is loaded."""
    half, trainer = parts.aggregator.needs.client_half, parts.client
    if half is not None and trainer.objective is not half:
        if trainer.objective.overrides:  # it would change local training: derived, so never dropped unsaid
            shown = f"aggregator={parts.choices['aggregator']}" if parts.choices.get("aggregator") else "the aggregator"
            raise ValueError(f"{shown} brings its own client half ({type(half).__name__}); client objective "
                             f"{type(trainer.objective).__name__} cannot be added to it: use client/objective=none")
        trainer.objective = half
    trainer.sensitivity = parts.aggregator.needs.sensitivity  # measured during local training when declared
    parts.aggregator.check_clients(ClientSetup(trainer.solver(), settings.num_clients, settings.per_round))
    check_adapters(parts)
    parts.adapter.check(settings.num_clients)
    parts.engine.check(trainer)
    parts.system.check(trainer.local_epochs)
    parts.server = parts.server or Synchronous()  # rounds unless the server group says otherwise
    parts.channel = Channel.of(parts.channel).connect(parts.attack, parts.aggregator.channel_stages())
    sampleable = settings.num_clients - len(settings.held_out_ids)
    per_step, count = parts.server.per_step(settings)  # clients_per_round; server.concurrency when asynchronous
    parts.sampler.check(per_step, sampleable, count)
    sampler = "" if parts.sampler.equal_chance else f"sampler={parts.choices.get('sampler', type(parts.sampler).__name__)}"
    parts.server.check(parts, settings)  # the rule, clock, channel and system its schedule can run
    if not parts.server.asynchronous:  # over-selection is of synchronous rounds (the asynchronous server refuses it)
        parts.clock.check(per_step, sampleable)
    parts.channel.check(Setup(
        settings.num_clients, settings.per_round, sampleable=sampleable, online_varies=parts.system.takes_clients_offline,
        rule=describe(parts.aggregator, parts.choices.get("aggregator")), sampler=sampler))
    check_held_out(trainer.val_frac, trainer.test_frac, parts.aggregator.needs, settings.eval_per_client)
    if settings.eval_split == "val" and not settings.held_out and effective_val_frac(trainer.val_frac, parts.aggregator.needs) == 0:
        raise ValueError(f"eval.split=val needs validation data, but client.val_frac={trainer.val_frac} holds none out; "
                         "set client.val_frac to a fraction in (0, 1), e.g. 0.1, or eval.held_out_clients to a share of the clients")
    fraction = parts.attack.fraction
    if fraction > 0 and int(fraction * settings.num_clients) == 0:  # legal, but no client is corrupted
        log.warning("attack.fraction=%g corrupts nobody with num_clients=%d (floor(%g * %d) = 0): the run has no "
                    "attacker; a fraction of at least %.3g corrupts one client", fraction, settings.num_clients,
                    fraction, settings.num_clients, 1 / settings.num_clients)


def check_adapters(parts: Parts) -> None:
    """Refuse a rule on low-rank adapters without them (it reads the factors' places from the layout)."""
    if parts.aggregator.needs.adapters and type(parts.adapter) is NoAdapter:
        chosen = parts.choices.get("aggregator") or type(parts.aggregator).__name__
        raise ValueError(f"aggregator={chosen} combines low-rank adapters, but adapter=none trains the whole model; "
                         "set adapter=lora, or choose a rule for whole models (fedavg, ...)")


def describe(aggregator: Aggregator, chosen: str | None = None) -> Rule:
    """The aggregator as the channel's stages check it (`fedagg.channel` imports nothing from the aggregators);
    `chosen`: the option as the user typed it (`aggregator=fedcams`), else the class is named."""
    return Rule(shown=f"aggregator={chosen}" if chosen else f"aggregator {type(aggregator).__name__}",
                weighting=str(getattr(aggregator, "weighting", "")), weighted_mean=aggregator.weighted_mean,
                compresses_uploads=aggregator.compresses_uploads, same_uncompressed=aggregator.same_uncompressed,
                # a rule that replaces the whole aggregate step forms no mean a server side could act on
                forms_mean=type(aggregator).aggregate is Aggregator.aggregate)


def check_held_out(val_frac: float | None, test_frac: float | None, needs: Needs, per_client: bool) -> None:
    """Refuse validation and local test shares that together leave a client nothing to train on."""
    val, test = effective_val_frac(val_frac, needs), effective_test_frac(test_frac, per_client)
    if round(val + test, 9) >= 1:
        shown = [f"client.{key}={given}" if given is not None else f"client.{key}=null ({used:g})"
                 for key, given, used in (("val_frac", val_frac, val), ("test_frac", test_frac, test))]
        raise ValueError(f"{shown[0]} and {shown[1]} are not allowed together: they hold out {val + test:.0%} of "
                         "each client's data and leave nothing to train on; their sum must be below 1")


def effective_test_frac(test_frac: float | None, per_client: bool) -> float:
    """`client.test_frac: null` holds out 20% as each client's local test split only with eval.per_client."""
    if test_frac is None:
        return DEFAULT_TEST_FRAC if per_client else 0.0
    if test_frac > 0 and not per_client:
        raise ValueError(f"client.test_frac={test_frac} is not allowed with eval.per_client=false: the local test "
                         "split would be taken from training and never scored; set eval.per_client=true")
    if test_frac == 0 and per_client:
        raise ValueError("client.test_frac=0.0 is not allowed with eval.per_client=true: it needs a local test split; "
                         "leave client.test_frac null (0.2) or give a fraction in (0, 1)")
    return test_frac


def effective_val_frac(val_frac: float | None, needs: Needs) -> float:
    """`client.val_frac: null` holds out 10% only when the aggregator scores clients on their own data."""
    if val_frac is not None:
        return val_frac
    return DEFAULT_VAL_FRAC if needs.val_acc == "local" else 0.0


def check_model_for(objective, model: nn.Module, choices: dict) -> None:
    """Refuse, in one line, a model the client objective cannot read what it declared from (a representation) or
    otherwise cannot work with (`Objective.setup`: FedBN without normalisation layers)."""
    sees = objective.sees
    if (sees.representation or sees.projection_head) and not isinstance(model, Backbone):
        chosen = next((f"{group}={choices[group]}" for group in ("client/objective", "aggregator")
                       if choices.get(group) not in (None, "none")), type(objective).__name__)
        raise ValueError(f"{chosen} reads the model's representation, but {type(model).__name__} does not expose "
                         "one: a model must be a fedagg.models.base.Backbone (every model in conf/model/ is)")
    objective.setup(model)


def check_fits(model: nn.Module, data: DeviceData) -> None:
    """One forward pass on two training samples, so that a backbone that cannot take the dataset (an LSTM on
    images, a classifier sized for other images) is one line before any training, not a traceback in round 1.
    Training samples, not test ones: a tuning trial (eval.split=val) must never read the test set."""
    x = data.prepare(data.train_x[:2])
    was_training = model.training
    model.eval()  # leaves BatchNorm's running statistics as they are
    try:
        with torch.no_grad():
            model(x)
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"model {type(model).__name__} cannot take dataset {data.name}'s inputs of shape "
                         f"{tuple(x.shape[1:])}: {first}; choose another model=NAME") from None
    finally:
        model.train(was_training)


def assemble(parts: Parts, settings: Settings, *, data_root: str | Path, device, experiment_scale: float = 1.0,
             download: bool = False) -> Federation:
    """Load the data onto `device`, hold out the server's samples, partition the rest into clients
    (each with its validation split) and build the initial model, every step from its own stream."""
    bundle = None
    if settings.num_clients is None:  # all of the dataset's own clients: how many is known once it is loaded
        if not takes_owners(parts.partition):
            raise ValueError("num_clients=null is only allowed with partition=natural (all of a federated dataset's "
                             "own clients); give the number of clients to split the data into")
        bundle = parts.dataset(root=str(Path(data_root).expanduser()), download=download)
        if bundle.train_owner is None:
            natural_partition(bundle.train_y, 1, generator=torch.Generator())  # raises the one-line error for such a dataset
        settings = replace(settings, num_clients=int(bundle.train_owner.unique().numel()))
    connect(parts, settings)
    if isinstance(parts.noise, bool) or not isinstance(parts.noise, (int, float)) or not 0 <= parts.noise < float("inf"):
        raise ValueError(f"partition.noise={parts.noise!r} is not allowed; it must be a finite number at least 0 "
                         "(the noise's standard deviation for the last client)")
    needs = parts.aggregator.needs
    if bundle is None:
        bundle = parts.dataset(root=str(Path(data_root).expanduser()), download=download)
    server_idx, pool = hold_out_server_split(bundle.train_y.numel(), needs.server_samples, settings.seed)
    pool_labels = bundle.train_y[pool]
    owners = None if bundle.train_owner is None else bundle.train_owner[pool]
    split = split_pool(parts.partition, pool_labels, settings.num_clients, generator(settings.seed, "partition"), owners)
    natural = takes_owners(parts.partition)
    if natural:  # the test set becomes the union of these clients' own test splits
        split, _ = shrink(split, 0, experiment_scale, settings.seed)
        own, _ = shrink(own_test_splits([int(owners[p[0]]) for p in split], bundle.test_owner), 0, experiment_scale,
                        settings.seed)
        order = torch.cat(own)
        bundle.test_x, bundle.test_y = bundle.test_x[order], bundle.test_y[order]
        own = list(torch.arange(order.numel()).split([t.numel() for t in own]))
    else:
        split, test_subset = shrink(split, bundle.test_y.numel(), experiment_scale, settings.seed)
        if test_subset is not None:
            bundle.test_x, bundle.test_y = bundle.test_x[test_subset], bundle.test_y[test_subset]
    stats = partition_stats(pool_labels, split, bundle.num_classes)
    objective = parts.client.objective
    model = build_model(parts.model, bundle, settings.seed, device, objective.sees.projection_head)
    adapters = parts.adapter.apply(model, settings.num_clients, settings.seed, needs.frozen_a)
    parts.client.rank_masks = RankMasks.of(adapters.layout, device)
    check_model_for(objective, model, parts.choices)
    data = DeviceData(bundle, device, model.input_shape, model=f"model {type(model).__name__}",
                      takes=model.takes if isinstance(model, Backbone) else None)
    check_fits(model, data)
    if parts.noise > 0:
        data.add_feature_noise([pool[p] for p in split], float(parts.noise), settings.seed)
    if len(model.input_shape) == 3 and model.input_shape[1] >= 4 * bundle.image_size:  # built for much larger images
        log.warning("%s takes %dx%d inputs: %s's %dx%d images are upsampled %dx; a backbone for small images "
                    "(e.g. a CIFAR stem) may suit them better", type(model).__name__, *model.input_shape[1:],
                    bundle.name, bundle.image_size, bundle.image_size, model.input_shape[1] // bundle.image_size)
    val_frac = effective_val_frac(parts.client.val_frac, needs)
    if natural and parts.client.test_frac is not None:
        raise ValueError(f"client.test_frac={parts.client.test_frac} is not used with partition=natural: each client "
                         "is scored on its own test split from the dataset; leave client.test_frac null")
    test_frac = 0.0 if natural else effective_test_frac(parts.client.test_frac, settings.eval_per_client)
    clients = make_clients([pool[p] for p in split], val_frac, settings.seed, device, test_frac)
    if natural:
        data.local_tests = "test"
        for client, test in zip(clients, own):
            client.test_idx = test.to(device)
    server_idx = server_idx.to(device)
    check_needs(needs, clients, server_idx, val_frac, type(parts.aggregator).__name__)
    corrupted = parts.attack.corrupted_clients(settings.seed, settings.num_clients)
    if corrupted:  # a data attack changes the corrupted clients' labels once, for every engine
        own = torch.cat([torch.cat([clients[i].train_idx, clients[i].val_idx]) for i in corrupted])
        data.train_y = parts.attack.poison_labels(data.train_y, own, data.num_classes)
    parts.clock.connect(settings.seed, settings.num_clients)
    # engine=auto picks its engine from the run's configuration, now that the model is built
    shape = RoundShape(parts.server.per_step(settings)[0], model_kind(model), sum(p.numel() for p in model.parameters()),
                       parts.client.batch_size, torch.device(device).type)
    engine, picked = parts.engine.for_run(shape)
    return Federation(data, model, clients, parts.aggregator, parts.client, engine, parts.logger, server_idx, stats,
                      parts.system, parts.clock, server=parts.server, attack=parts.attack, corrupted=corrupted,
                      channel=parts.channel, sampler=parts.sampler, settings=settings, adapters=adapters,
                      picked=picked)
