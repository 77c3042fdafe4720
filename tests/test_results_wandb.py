"""A sweep that logged to W&B gets its report and table attached to its W&B group (offline mode, read back)."""

import json
import struct
import time
from pathlib import Path

import pytest

from fedagg.results import report
from results_runs import fake_run

LOGGER = {"_target_": "fedagg.tracking.wandb_tracker.WandbTracker", "project": "fedagg-test", "entity": None,
          "mode": "offline", "group": "sweep-7", "tags": [], "name": None}


def records(path: Path):
    """The protobuf records of an offline run's .wandb file (a LevelDB-style log: 32 KiB blocks of chunks, each
    with a 7-byte header: CRC, length, type 1 full / 2 first / 3 middle / 4 last), after its 7-byte file header."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, pending = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length, kind) == (0, 0):  # the rest of a block is padding
            pos += left
            continue
        if pos + 7 + length > len(data):  # a chunk still being written
            return
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def finished_records(path: Path, timeout: float = 30.0) -> list:
    """The records once the run's exit record is on disk: W&B's service may finish writing after run.finish()."""
    end = time.monotonic() + timeout
    while True:
        found = list(records(path))
        if any(r.WhichOneof("record_type") == "exit" for r in found) or time.monotonic() > end:
            return found
        time.sleep(0.1)


def test_report_attaches_table_and_page_to_the_runs_wandb_group(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))  # nothing outside tmp_path
    monkeypatch.setenv("WANDB_MODE", "offline")
    sweep = tmp_path / "sweep"
    for i, (agg, seed) in enumerate([("fedavg", 0), ("fedavg", 1), ("median", 0), ("median", 1)]):
        acc = 0.8 + 0.05 * (agg == "median") + 0.01 * seed
        metrics = [{"round": r, "test_acc": acc - 0.1 * (3 - r), "bits_up_total": 1000 * r, "bits_down_total": 1000 * r}
                   for r in (1, 2, 3)]
        fake_run(sweep / str(i), seed=seed, acc=acc, choices={"aggregator": agg}, config={"logger": LOGGER},
                 metrics=metrics)
    assert report.main([str(sweep)]) == 0
    offline = list((sweep / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    found = {}
    for record in finished_records(next(offline[0].glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found["run"] = (record.run.project, record.run.run_group, record.run.job_type)
        elif kind == "artifact" and record.artifact.type == "report":
            found["artifact"] = {e.path: Path(e.local_path) for e in record.artifact.manifest.contents}
    assert found["run"] == ("fedagg-test", "sweep-7", "report")  # in the runs' project and group
    staged = found["artifact"]
    assert set(staged) == {"report.html", "table.csv", "table.table.json"}
    assert staged["report.html"].read_bytes() == (sweep / "report.html").read_bytes()
    # the table: the cells of the report's table, as a W&B table (logged to the run too) and as CSV
    cells = json.loads(staged["table.table.json"].read_text())
    header = staged["table.csv"].read_text().splitlines()[0].split(",")
    assert cells["columns"] == header and "mean" in header
    rows = {tuple(row[:2]): row for row in cells["data"]}
    mean = header.index("mean")
    assert sorted(rows) == [("fedavg", "digits"), ("median", "digits")]
    assert rows[("fedavg", "digits")][mean] == pytest.approx(80.5)  # in %: seeds 0 and 1, 80 and 81
    assert rows[("median", "digits")][mean] == pytest.approx(85.5)
    logged = list((offline[0] / "files" / "media" / "table").glob("*.table.json"))
    assert len(logged) == 1 and json.loads(logged[0].read_text())["data"] == cells["data"]
