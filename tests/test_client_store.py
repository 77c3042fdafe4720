"""Per-client state (SCAFFOLD's c_k, FedDyn's g_k, kept momentum) in a ClientStore: bounded memory, small checkpoints."""

import torch

import fedagg.clients.store as store_module
from conftest import compose_config
from fedagg.aggregators.scaffold import Scaffold
from fedagg.clients.store import ClientStore
from fedagg.runtime.interrupts import StoppedNow
from fedagg.run import train

ROW = 4 * 4  # bytes of one float32 [4] tensor


def _value(i, step=0):
    return torch.tensor([i, i + 0.5, -i, step], dtype=torch.float32)


def _files(folder):
    return sorted(p.name for p in folder.glob("*.pt"))


def test_memory_holds_at_most_the_budget_and_the_rest_comes_back_from_files(tmp_path):
    store = ClientStore(memory_budget=2 * ROW)
    store.attach(tmp_path)
    for i in range(5):
        store.put(i, _value(i))
    assert store.memory_bytes == 2 * ROW and len(store) == 5 and store.ids() == [0, 1, 2, 3, 4]
    assert _files(tmp_path) == ["0.1.pt", "1.2.pt", "2.3.pt"]  # the least recently used went to files
    for i in (0, 4, 2):
        assert torch.equal(store.get(i), _value(i))
    assert store.memory_bytes == 2 * ROW and store.get(7) is None and 7 not in store and 3 in store
    assert store.keys() == {0, 1, 2, 3, 4} and torch.equal(store[1], _value(1))


def test_without_a_folder_everything_stays_in_memory_and_in_the_checkpoint():
    store = ClientStore(memory_budget=0)
    store[3] = _value(3)
    store.put(1, _value(1))
    state = store.state_dict()
    assert state["files"] == {} and sorted(state["inline"]) == [1, 3]
    again = ClientStore()
    again.load_state_dict({5: _value(5)})  # a checkpoint written before the store: {client id: tensor}
    assert again.ids() == [5] and torch.equal(again[5], _value(5))


def test_a_resumed_store_sees_its_checkpoint_not_what_was_written_after_it(tmp_path):
    store = ClientStore(memory_budget=ROW, inline_limit=0)
    store.attach(tmp_path)
    for i in range(3):
        store.put(i, _value(i))
    state = store.state_dict()  # past the inline limit: written to files, the checkpoint only names them
    assert state["inline"] == {} and state["files"] == {0: 1, 1: 2, 2: 3} and state["version"] == 3
    for i in range(3):
        store.put(i, _value(i, step=1))  # the next round, then the run is killed
    store.put(3, _value(3, step=1))
    assert _files(tmp_path) == ["0.1.pt", "0.4.pt", "1.2.pt", "1.5.pt", "2.3.pt", "2.6.pt"]
    resumed = ClientStore(memory_budget=ROW)
    resumed.attach(tmp_path)
    resumed.load_state_dict(state)
    assert resumed.ids() == [0, 1, 2] and _files(tmp_path) == ["0.1.pt", "1.2.pt", "2.3.pt"]
    assert all(torch.equal(resumed[i], _value(i)) for i in range(3))


def test_old_versions_are_removed_once_no_kept_checkpoint_names_them(tmp_path):
    store = ClientStore(memory_budget=0, inline_limit=0)
    store.attach(tmp_path)
    for step in range(6):
        for i in range(4):
            store.put(i, _value(i, step))
        store.state_dict()
    # the live tensors and those of the last three checkpoints (the newest is the live one, in memory)
    assert _files(tmp_path)[:3] == ["0.13.pt", "0.17.pt", "0.21.pt"] and len(_files(tmp_path)) == 3 * 4
    assert torch.equal(store[0], _value(0, 5))


class ScaffoldStoppedInRound3(Scaffold):
    stop = False

    def server_update(self, inputs, update):
        if inputs.round == 3 and ScaffoldStoppedInRound3.stop:
            raise KeyboardInterrupt  # after round 3's clients wrote their state: Ctrl-C twice
        return super().server_update(inputs, update)


def test_a_run_spilling_its_client_state_resumes_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "MEMORY_BUDGET", 0)  # every client's state but the newest goes to a file
    monkeypatch.setattr(store_module, "INLINE_LIMIT", 0)
    overrides = ["rounds=4", "device=cpu", "checkpoint_every=2", "clients_per_round=4", "client.momentum=0.9",
                 "client.keep_optimizer_state=true", f"aggregator._target_={__name__}.ScaffoldStoppedInRound3"]
    train(compose_config(*overrides), tmp_path / "reference")
    run = tmp_path / "run"
    monkeypatch.setattr(ScaffoldStoppedInRound3, "stop", True)
    try:
        train(compose_config(*overrides), run)
    except StoppedNow:
        pass
    monkeypatch.setattr(ScaffoldStoppedInRound3, "stop", False)
    ckpt = torch.load(run / "checkpoint.pt", weights_only=False)
    variates = ckpt["trainer"]["objective"]["variates"]
    assert ckpt["round"] == 2 and variates["inline"] == {} and len(variates["files"]) >= 4
    newer = [p for p in (run / "client_state" / "scaffold_variates").glob("*.pt")
             if int(p.stem.split(".")[1]) > variates["version"]]
    assert newer  # round 3 wrote state the resumed run must not read
    train(compose_config(*overrides, "resume=true"), run)
    a, b = torch.load(run / "model.pt"), torch.load(tmp_path / "reference" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same process and operations: bit for bit
    assert (run / "weights.csv").read_bytes() == (tmp_path / "reference" / "weights.csv").read_bytes()
