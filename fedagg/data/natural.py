"""`partition=natural`: the clients a federated dataset comes with (FEMNIST's writers, Shakespeare's
speaking roles, Synthetic's devices), each with its own test split.

The partition keeps the signature of every other (DESIGN "Partition") and adds one keyword,
`owners` (the dataset's client id of every training-pool sample): the round's assembly passes
it to a partition that names it, so a label partition (dirichlet, ...) still runs on a
federated dataset, pooling its writers. A client's local test samples are then its own test
split from the dataset, not a share of its training data, and the global test set is the
union of the federation's clients' test splits (every client's when `num_clients` is null,
the sampled ones' otherwise), as LEAF evaluates a sample of users on their own test data.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor


def natural(labels: Tensor, num_clients: int, *, generator: torch.Generator,
            owners: Tensor | None = None) -> list[Tensor]:
    """Each of `num_clients` of the dataset's clients, drawn from `generator` and kept in the dataset's
    order, gets all its training samples (`owners[i]`: the client of sample i)."""
    if owners is None:
        raise ValueError("partition=natural needs a dataset with its own clients (synthetic, femnist, shakespeare); "
                         "this dataset has none: choose a label partition such as partition=dirichlet")
    if owners.shape != labels.shape:
        raise ValueError(f"owners must give one client per sample: {tuple(owners.shape)} for {tuple(labels.shape)} labels")
    owners = owners.cpu().long()
    ids, counts = torch.unique(owners, return_counts=True)
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or not 1 <= num_clients <= len(ids):
        raise ValueError(f"num_clients={num_clients!r} is not allowed with partition=natural: the dataset has "
                         f"{len(ids)} clients; use an integer from 1 to {len(ids)}, or null for all of them")
    picked = torch.randperm(len(ids), generator=generator)[:num_clients].sort().values
    groups = torch.sort(owners, stable=True).indices.split(counts.tolist())  # each client's samples, in their order
    return [groups[i].clone() for i in picked.tolist()]


def takes_owners(partition) -> bool:
    """Whether a partition (a function or a partial of one) splits by the dataset's own clients."""
    try:
        return "owners" in inspect.signature(partition).parameters
    except (TypeError, ValueError):  # a callable without a signature is a label partition
        return False


def split_pool(partition, labels: Tensor, num_clients: int, generator: torch.Generator,
               owners: Tensor | None) -> list[Tensor]:
    """`partition(labels, num_clients, generator=...)`, with the samples' owners for one that takes them."""
    if takes_owners(partition):
        return partition(labels, num_clients, generator=generator, owners=owners)
    return partition(labels, num_clients, generator=generator)


def own_test_splits(client_owner: list[int], test_owner: Tensor) -> list[Tensor]:
    """Indices into the test set of each client's own test samples (`client_owner[k]`: client k's dataset id)."""
    test_owner = test_owner.cpu().long()
    ids, counts = torch.unique(test_owner, return_counts=True)
    groups = dict(zip(ids.tolist(), torch.sort(test_owner, stable=True).indices.split(counts.tolist())))
    empty = torch.zeros(0, dtype=torch.long)
    return [groups.get(owner, empty).clone() for owner in client_owner]
