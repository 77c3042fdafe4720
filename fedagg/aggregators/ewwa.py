"""EWWA-FL (Hu et al. 2023, Algorithm 2): element-wise aggregation weights from Adam-like moments.

Every client gets its own weight for every parameter. Each client's pseudo-gradient
g_k = w - W_k passes through an Adam/Adagrad/Yogi moment update on the server; the
resulting step b_k (how far the optimizer would move that element) is turned into
per-element weights over clients, and the new global is the weighted mix of clients.
Two readings of the moments: the authors' code (`shared_sequential`,
default) runs the clients one after another through one shared m, v; the paper's
Algorithm 2 (`per_client`) starts every client from last round's m, v and averages.
Buffers (BatchNorm statistics) are averaged with D (`buffers: samples`), or, as the
authors' code does, treated as more elements of the same vector (`buffers: elementwise`):
moments, the shift of the weights and the weights themselves then run over parameters and
buffers together, and the buffers' moments start from the model's own statistics, because
that code starts m and v from a copy of the model whose weights alone are zeroed.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
from torch import Tensor

from fedagg.aggregators.base import AggregateResult, Aggregator, sample_weights
from fedagg.aggregators.blocks import column_blocks
from fedagg.aggregators.inputs import Needs, RoundInputs
from fedagg.config.constraints import Range, checked

# beta = 1 would make s_r = lr * sqrt(1 - beta2^r) / (1 - beta1^r) zero or a division by zero
Beta = Annotated[float, Range(ge=0, lt=1, words="it must be in [0, 1)")]
QUANTILES = (0.1, 0.5, 0.9)
QUANTILE_SAMPLE = 1 << 20  # torch.quantile sorts: an evenly strided sample of at most this many weights


class StridedSample:
    """An evenly strided sample, at most QUANTILE_SAMPLE long, of the row-major flattening of a
    [K, P] tensor that arrives in column blocks."""

    def __init__(self, k: int, p: int, device: torch.device) -> None:
        positions = torch.arange(0, k * p, -(-k * p // QUANTILE_SAMPLE), device=device)
        self.rows, self.cols = positions // p, positions % p
        self.values = torch.empty(positions.numel(), device=device)

    def add(self, block: Tensor, cols: slice) -> None:
        """The sampled entries of block [K, cols]."""
        here = (self.cols >= cols.start) & (self.cols < cols.stop)
        self.values[here] = block[self.rows[here], self.cols[here] - cols.start].float()

    def quantiles(self) -> dict[str, float]:
        values = torch.quantile(self.values, torch.tensor(QUANTILES, device=self.values.device))
        return {f"weight_q{round(100 * q):02d}": float(v) for q, v in zip(QUANTILES, values)}


def weight_quantiles(p: Tensor) -> dict[str, float]:
    """10th, 50th and 90th percentile of the per-element weights p [K, P] (uniform: all 1/K)."""
    sample = StridedSample(*p.shape, p.device)
    sample.add(p, slice(0, p.shape[1]))
    return sample.quantiles()


class EWWA(Aggregator):
    """`conf/aggregator/ewwa.yaml`: new global w - sum_k p_k * g_k with element-wise p_k."""

    @checked("aggregator.")
    def __init__(
        self,
        optimizer: Literal["adam", "adagrad", "yogi"] = "adam",
        moments: Literal["shared_sequential", "per_client"] = "shared_sequential",
        weighting: Literal["log_shift", "softmax"] = "log_shift",
        lr: Annotated[float, Range(gt=0, words="it must be > 0")] = 1.0,
        beta1: Beta = 0.9,
        beta2: Beta = 0.999,
        # eps > 0 keeps b = m / (sqrt(v) + eps) finite when a client's update is all zeros (m = v = 0)
        eps: Annotated[float, Range(gt=0, words="it must be > 0")] = 1e-8,
        buffers: Literal["samples", "elementwise"] = "samples",
    ) -> None:
        self.optimizer, self.moments, self.weighting, self.buffers = optimizer, moments, weighting, buffers
        self.needs = Needs(buffers=self.buffers == "elementwise")
        self.lr, self.beta1, self.beta2, self.eps = float(lr), float(beta1), float(beta2), float(eps)
        self.m: Tensor | None = None  # [P] first moment ([P + B] elementwise); zeros before the first round (Alg. 2 line 2)
        self.v: Tensor | None = None  # [P] second moment, likewise (Alg. 2 line 3)
        self.step = 0  # rounds this aggregator has aggregated: r of s_r

    def _second_moment(self, v: Tensor, g: Tensor) -> Tensor:
        """v after one gradient g (eqs. 2-4; Yogi in the additive form of fedagg's design and the authors' code)."""
        if self.optimizer == "adam":
            return self.beta2 * v + (1 - self.beta2) * g * g  # eq. (2)
        if self.optimizer == "adagrad":
            return v + g * g  # eq. (3)
        return v - (1 - self.beta2) * g * g * torch.sign(v - g * g)  # eq. (4), Yogi

    def _client_weights(self, b: Tensor, shift: Tensor | None = None) -> Tensor:
        """[K, n] per-element weights over clients (dim 0 sums to 1); log_shift takes the round's
        minimum step `shift` (by default the minimum of b)."""
        if self.weighting == "softmax":
            return torch.softmax(b, dim=0)  # Alg. 2 line 13
        shift = b.min() if shift is None else shift  # the authors' code: one minimum over all clients and all elements
        q = torch.log1p(b - shift) + 1e-8  # ln(b_k - beta + 1) + 1e-8 > 0, so no client gets weight 0
        return q / q.sum(dim=0)

    def _steps(self, g: Tensor, m: Tensor, v: Tensor, s: float) -> tuple[Tensor, Tensor, Tensor]:
        """The steps b [K, n] for pseudo-gradients g [K, n] (clients by ascending id) from moments m, v [n],
        and the moments after the round."""
        if self.moments == "shared_sequential":
            b = torch.empty_like(g)
            for k in range(g.shape[0]):
                m = self.beta1 * m + (1 - self.beta1) * g[k]  # eq. (1)
                v = self._second_moment(v, g[k])
                b[k] = s * m / (v.sqrt() + self.eps)  # Alg. 2 line 11, moments as they stand after k
            return b, m, v
        m_k = self.beta1 * m + (1 - self.beta1) * g  # Alg. 2 line 7, every client from last round's m
        v_k = self._second_moment(v, g)  # Alg. 2 line 8 (v, not the printed m)
        return s * m_k / (v_k.sqrt() + self.eps), m_k.mean(dim=0), v_k.mean(dim=0)  # Alg. 2 lines 9-11

    def aggregate(self, inputs: RoundInputs) -> AggregateResult:
        global_params, client_params = inputs.global_params, inputs.client_params
        num_params, k = global_params.numel(), inputs.num_clients
        # one vector of parameters then buffers, as the authors' state dicts (`buffers: elementwise`)
        parts = [(global_params, client_params)]
        if self.buffers == "elementwise":
            parts.append((inputs.need("global_buffers").to(global_params), inputs.need("client_buffers").to(client_params)))
        if self.m is None:
            # zeros for the parameters; a buffer's moments start at its value in the model (see the module doc)
            self.m = torch.cat([torch.zeros_like(global_params), *(glob for glob, _ in parts[1:])])
            self.v = self.m.clone()
        self.m, self.v = self.m.to(global_params), self.v.to(global_params)  # a restored state may sit elsewhere
        self.step += 1
        r = self.step
        s = self.lr * math.sqrt(1 - self.beta2**r) / (1 - self.beta1**r)  # eq. (6), bias corrections
        # ascending client id: the sequential moments depend on the order, which must not
        # depend on the order the loop happened to list this round's clients in
        order = torch.argsort(inputs.client_ids.to(client_params.device))
        blocks, offset = [], 0  # (global [n], clients [K, n], columns in the part, place in m and v)
        for glob, clients in parts:  # column blocks (fedagg.aggregators.blocks), never across parts
            blocks += [(glob, clients, cols, slice(offset + cols.start, offset + cols.stop))
                       for cols in column_blocks(k, glob.numel(), inputs.block_rows) if cols.stop > cols.start]
            offset += glob.numel()  # a model without buffers has an empty part: no block
        m_new, v_new = torch.empty_like(self.m), torch.empty_like(self.v)

        def steps():  # each block's clients and steps b, from last round's moments
            for glob, clients, cols, at in blocks:
                block = clients[:, cols][order]
                g = glob[cols] - block  # [K, n]; Alg. 2 line 6, no division by the local lr
                b, m_new[at], v_new[at] = self._steps(g, self.m[at], self.v[at], s)
                del g  # not held while the caller works on the block
                yield block, b, at

        shift = None
        if self.weighting == "log_shift" and len(blocks) > 1:  # its one minimum needs every block's steps first
            for _, b, _ in steps():
                shift = b.min() if shift is None else torch.minimum(shift, b.min())
        new = torch.empty_like(global_params)
        p_sums = client_params.new_zeros(k)
        sample = StridedSample(k, num_params, global_params.device)
        buffer_weights = client_params.new_empty(k, offset - num_params)
        for block, b, at in steps():
            p = self._client_weights(b, shift)  # [K, n]
            if at.start >= num_params:
                buffer_weights[:, at.start - num_params:at.stop - num_params] = p
                continue
            # = w - sum_k p_k * g_k (Alg. 2 line 14), since sum_k p_k = 1 per element; anchored
            # on a client so that identical clients (or a single one) come back bit-exact
            new[at] = block[0] + (p * (block - block[0])).sum(dim=0)
            p_sums += p.sum(dim=1)
            sample.add(p, at)
        self.m, self.v = m_new, v_new
        weights = torch.empty_like(p_sums).index_copy_(0, order, p_sums / num_params)
        # BatchNorm statistics: averaged with D = n_k / n (fedagg's default), or [K, B] element-wise weights
        if self.buffers == "elementwise":
            buffer_weights = torch.empty_like(buffer_weights).index_copy_(0, order, buffer_weights)
        else:
            buffer_weights = sample_weights(inputs.num_samples)
        return AggregateResult(new, weights, buffer_weights=buffer_weights, metrics=sample.quantiles())

    def state_dict(self) -> dict:
        clone = (lambda t: None if t is None else t.detach().clone())
        return {"m": clone(self.m), "v": clone(self.v), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.m = None if state["m"] is None else state["m"].detach().clone()
        self.v = None if state["v"] is None else state["v"].detach().clone()
        self.step = int(state["step"])
