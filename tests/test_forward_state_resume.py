"""Per-client state of the new methods survives a stop at once: MOON's previous models, FedBN's local layers and
Elastic's sensitivities, spilled to files past their memory budget, resume bit for bit."""

import pytest
import torch

import fedagg.clients.store as store_module
from conftest import compose_config
from fedagg.runtime.interrupts import StoppedNow
from fedagg.run import train


class CtrlCTwiceAfterRound3:
    """A tracker whose round-3 record is interrupted at once: round 3's clients have written their state, the last
    checkpoint is round 2's."""

    stop = False

    def start(self, run_dir, config, name):
        pass

    def log_image(self, key, path):
        pass

    def log_round(self, round, metrics):
        if round == 3 and CtrlCTwiceAfterRound3.stop:
            raise KeyboardInterrupt

    def finish(self, summary):
        pass


@pytest.mark.parametrize("method, store", [
    (["client/objective=moon", "client.objective.projection_dim=8"], "previous_models"),
    (["aggregator=fedbn", "model=cnn_bn"], "fedbn_local_layers"),
    (["aggregator=elastic"], "sensitivity"),
])
def test_a_run_spilling_its_client_state_resumes_exactly(tmp_path, monkeypatch, method, store):
    monkeypatch.setattr(store_module, "MEMORY_BUDGET", 0)  # every client's state but the newest goes to a file
    monkeypatch.setattr(store_module, "INLINE_LIMIT", 0)
    overrides = ["rounds=4", "device=cpu", "checkpoint_every=2", "clients_per_round=4", "client.local_epochs=1",
                 f"logger._target_={__name__}.CtrlCTwiceAfterRound3", *method]
    train(compose_config(*overrides), tmp_path / "reference")
    run = tmp_path / "run"
    monkeypatch.setattr(CtrlCTwiceAfterRound3, "stop", True)
    with pytest.raises(StoppedNow):
        train(compose_config(*overrides), run)
    monkeypatch.setattr(CtrlCTwiceAfterRound3, "stop", False)
    ckpt = torch.load(run / "checkpoint.pt", weights_only=False)
    assert ckpt["round"] == 2
    files = list((run / "client_state" / store).glob("*.pt"))
    assert len(files) >= 4  # the state lived in files, some written by round 3 after the checkpoint
    train(compose_config(*overrides, "resume=true"), run)
    a, b = torch.load(run / "model.pt"), torch.load(tmp_path / "reference" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (run / "weights.csv").read_bytes() == (tmp_path / "reference" / "weights.csv").read_bytes()
    rows = lambda p: [line.rsplit(",", 1)[0] for line in p.read_text().splitlines()]  # noqa: E731 (but elapsed_s)
    assert rows(run / "metrics.csv") == rows(tmp_path / "reference" / "metrics.csv")
