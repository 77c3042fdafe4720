"""Helpers for tests of the upload channel: one round's `Upload`, and a stage's client then server side."""

import torch

from fedagg.channel import Upload


def upload(k: int, p: int, ids=None, corrupted=None, rate=None, r: int = 1, start=None, seed: int = 0) -> Upload:
    start = torch.zeros(p) if start is None else start
    corrupted = torch.zeros(k, dtype=torch.bool) if corrupted is None else torch.tensor(corrupted)
    return Upload(start, tuple(range(k)) if ids is None else tuple(ids), corrupted, seed, r, 10, rate)


def release(stage, u, g, rate=None):
    """(the rows stage's client side sends, its server side on their uniform mean), with one stream g."""
    up = upload(*u.shape, rate=rate)
    rows = stage.client(u, up, g)
    return rows, stage.server(rows.mean(dim=0), up, g)


def through_channel(agg, inputs, channel=None):
    """agg.aggregate(inputs) as a run does it: what the clients send passes `channel` (none by default) with the
    rule's own stages (`Aggregator.channel_stages`: FedCAMS's compression) after the attack, and the mean its
    server sides."""
    import dataclasses

    from fedagg.attacks.base import Attack
    from fedagg.channel import Channel

    channel = (channel or Channel()).connect(Attack(), agg.channel_stages())
    k = inputs.num_clients
    up = Upload(inputs.global_params, tuple(inputs.client_ids.tolist()), torch.zeros(k, dtype=torch.bool), inputs.seed,
                inputs.round, 10)
    arrived = channel.transmit(inputs.client_params, up)
    return agg.aggregate(dataclasses.replace(inputs, client_params=arrived.models, on_mean=arrived.on_mean))
