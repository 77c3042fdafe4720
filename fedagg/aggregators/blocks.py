"""Round-wide arithmetic on the participants' [K, P] in blocks, so temporaries stay small.

The round's [K, P] of trained models is the one round-wide tensor the contract hands an
aggregator. Anything computed from it (the updates Delta_k when a rule needs them all at once,
`RoundInputs.updates`, EWWA-FL's moments and weights) would be another [K, P] for each
temporary: with a ResNet-18 and 100 clients, 4.4 GB each. `RoundInputs.block_rows` says how many clients' worth of
parameters a temporary may hold (the engine's clients in memory: `engine.chunk_size`, one
for the sequential engine), and these helpers cut the work accordingly:

- column blocks ([K, width], width * K <= block_rows * P) for rules that combine clients
  per parameter (weighted means, element-wise weights);
- row blocks ([block_rows, P]) for rules that treat each client's vector on its own
  (norms, compression).

A round of at most `block_rows` clients is one block, computed exactly as without blocks.
Column blocks start at multiples of `ALIGN` elements: the CPU kernels then vectorise each
column the same way as in one call over all columns, so per-parameter results came out
bit for bit the same where measured (sums and matrix-vector products over the client axis,
on this project's CPUs); nothing guarantees it for another BLAS or kernel, and on a GPU they
are equal up to float rounding, which is what the tests check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from fedagg.aggregators.inputs import RoundInputs

ALIGN = 64  # elements; see the module doc


def column_blocks(num_rows: int, num_cols: int, block_rows: int | None) -> list[slice]:
    """Column ranges of a [num_rows, num_cols] tensor whose [num_rows, width] pieces hold at most
    block_rows * num_cols elements (or ALIGN columns more for the last, and at least ALIGN)."""
    if block_rows is None or num_rows <= block_rows or num_cols == 0:
        return [slice(0, num_cols)]
    width = max(ALIGN, block_rows * num_cols // num_rows // ALIGN * ALIGN)
    starts = list(range(0, num_cols, width))
    if len(starts) > 1 and num_cols - starts[-1] < ALIGN:
        starts.pop()  # a last piece narrower than ALIGN joins the one before: narrow pieces reduce differently
    return [slice(start, end) for start, end in zip(starts, starts[1:] + [num_cols])]


def row_blocks(num_rows: int, block_rows: int | None) -> list[slice]:
    """Row ranges of at most block_rows rows."""
    if block_rows is None or num_rows <= block_rows:
        return [slice(0, num_rows)]
    return [slice(start, min(start + block_rows, num_rows)) for start in range(0, num_rows, block_rows)]


def weighted_update(weights: Tensor, inputs: RoundInputs) -> Tensor:
    """sum_k weights_k Delta_k [P], Delta_k against each client's start (`RoundInputs.update_block`), with
    [K, P] temporaries cut to column blocks."""
    update = inputs.global_params.new_empty(inputs.global_params.shape)
    for cols in column_blocks(*inputs.client_params.shape, inputs.block_rows):
        update[cols] = weights @ inputs.update_block(cols=cols)
    return update


def update_norms(inputs: RoundInputs) -> Tensor:
    """||Delta_k|| for every client [K], a row block at a time."""
    return torch.cat([torch.linalg.vector_norm(inputs.update_block(rows), dim=1)
                      for rows in row_blocks(inputs.num_clients, inputs.block_rows)])
