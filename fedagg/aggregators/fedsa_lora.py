"""FedSA-LoRA (Guo et al., ICLR 2025): A is shared (averaged), B stays with each client; one method, two halves.

Released code: Pengxin-Guo/FedSA-LoRA@fc276b5: the server averages every parameter not listed in
`federate.local_param` (federatedscope/llm/yamls/fedsa-lora.yaml:16 lists `lora_B`; the GLUE runs,
federatedscope/glue/yamls/fedsa-lora.yaml:14, keep the classifier local too, which here is frozen with the
base). The client half keeps each client's B by client id in a `ClientStore` (in memory up to its budget,
then spilled to files in the run folder) and puts it into the model the client starts from; a client never
trained starts from the initial B (zero). The server averages A with the weighting; the global model the test
set scores carries the weighted mean of the participants' B (a client-independent model to evaluate), and
with `eval.per_client=true` each client is scored with its own B. Uploads and downloads are A alone.
"""

from __future__ import annotations

from torch import Tensor, nn

from fedagg.aggregators.adapter_rules import AdapterRule, factor_mask
from fedagg.aggregators.base import Weighting
from fedagg.aggregators.inputs import Needs
from fedagg.clients.objectives import LocalWork, Objective
from fedagg.clients.store import ClientStore
from fedagg.config.constraints import checked
from fedagg.models.adapters.layout import AdapterLayout
from fedagg.models.flat import get_params


class FedSAClient(Objective):
    """Client half: per client id its B factors, flat [P_B]."""

    personal = True

    def __init__(self) -> None:
        self.local = ClientStore()  # client id -> its B after its last training
        self.mask: Tensor | None = None  # [P] bool: the B entries of the flat vector
        self.initial: Tensor | None = None  # the initial B, for clients never trained

    def setup(self, model: nn.Module) -> None:
        self.mask = factor_mask(model, "B")
        if not bool(self.mask.any()):
            raise ValueError("aggregator=fedsa_lora keeps each client's adapter B, but the model has none; set "
                             "adapter=lora")
        self.initial = get_params(model)[self.mask]

    def start(self, client_id: int, params: Tensor, buffers: Tensor) -> tuple[Tensor, Tensor]:
        kept = self.local.get(client_id)
        params = params.clone()
        params[self.mask] = (self.initial if kept is None else kept).to(params.device, params.dtype)
        return params, buffers

    def after_training(self, client_id: int, trained: Tensor, global_params: Tensor, work: LocalWork) -> None:
        self.local.put(client_id, trained[self.mask])

    def client_stores(self) -> dict[str, ClientStore]:
        return {"fedsa_lora_b": self.local}

    def state_dict(self) -> dict:
        return {"local": self.local.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.local.load_state_dict(state["local"])


class FedSALoRA(AdapterRule):
    """`conf/aggregator/fedsa_lora.yaml`: the weighted mean of A (and of B, for the scored global model); the
    client half keeps each client's B."""

    @checked("aggregator.")
    def __init__(self, weighting: Weighting = "samples", client: FedSAClient | None = None) -> None:
        super().__init__(weighting)
        self.client = FedSAClient() if client is None else client
        self.needs = Needs(adapters=True, client_half=self.client)

    def up_values(self, layout: AdapterLayout, rank: int) -> int:
        return sum(rank * pair.k for pair in layout.pairs)  # A only

    def down_values(self, layout: AdapterLayout, rank: int, ranks: list[int]) -> int:
        return sum(rank * pair.k for pair in layout.pairs)
