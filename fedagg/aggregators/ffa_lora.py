"""FFA-LoRA (Sun et al., ICLR 2024): A stays at its seeded initialisation, the same for every client; only B
trains and is averaged, which is exact: Σ p_k B_k A = (Σ p_k B_k) A.

No released code was found; this follows the paper's Sec. 4 (freeze the randomly initialised A, train and
aggregate B with FedAvg). A frozen A is part of the frozen base (`Needs.frozen_a`): the flat vector, every
upload and download is B alone (r d values per layer). The paper also scales α up for its DP runs; here α is
`adapter.alpha` as given.
"""

from __future__ import annotations

from fedagg.aggregators.adapter_rules import AdapterRule
from fedagg.aggregators.inputs import Needs
from fedagg.models.adapters.layout import AdapterLayout, sent_values


class FFALoRA(AdapterRule):
    """`conf/aggregator/ffa_lora.yaml`: FedAvg on B, with A frozen at its start."""

    needs = Needs(adapters=True, frozen_a=True)

    def up_values(self, layout: AdapterLayout, rank: int) -> int:
        return sent_values(layout, rank, frozen_a=True)

    def down_values(self, layout: AdapterLayout, rank: int, ranks: list[int]) -> int:
        return sent_values(layout, rank, frozen_a=True)
