"""Each client's rank as a mask on the padded factors: what a client of rank r starts a round from."""

from __future__ import annotations

import torch
from torch import Tensor

from fedagg.models.adapters.layout import AdapterLayout


class RankMasks:
    """Client id -> [P] bool mask of the factor entries its rank trains, one mask per distinct rank."""

    def __init__(self, client_ranks: tuple[int, ...], masks: dict[int, Tensor]) -> None:
        self.client_ranks, self.masks = client_ranks, masks

    @classmethod
    def of(cls, layout: AdapterLayout | None, device) -> "RankMasks | None":
        """None where every client has the padded rank (nothing to cut), or there are no adapters."""
        if layout is None or min(layout.client_ranks) == layout.rank:
            return None
        masks = {r: layout.rank_mask(r, device) for r in set(layout.client_ranks)}
        return cls(layout.client_ranks, masks)

    def cut(self, client_ids: list[int], params: Tensor) -> Tensor:
        """[k, P] each client's start `params` [k, P] with the factors beyond its rank set to zero (their gradients
        are then zero: the client trains and sends its rank-r factors, zero-padded)."""
        masks = torch.stack([self.masks[self.client_ranks[i]] for i in client_ids])
        return torch.where(masks, params, torch.zeros((), dtype=params.dtype, device=params.device))


def held_entries(layout: AdapterLayout, ranks: list[int], device=None) -> Tensor | None:
    """[K, P] bool: the entries of the padded flat vector clients of `ranks` hold (their own rank's factors), for the
    channel's compressors; None when every one holds the padded rank (all P)."""
    if min(ranks, default=layout.rank) == layout.rank:
        return None
    masks = {r: layout.rank_mask(r, device) for r in set(ranks)}
    return torch.stack([masks[r] for r in ranks])
