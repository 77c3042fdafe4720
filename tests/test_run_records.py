"""The run's CSV records live on disk only; a checkpoint keeps a mark (rows, bytes, digest) to cut them back to."""

import pytest

from fedagg.tracking.files import CSVLog


def _log(path, rounds, start=1, extra=False):
    log = CSVLog(path)
    for r in range(start, rounds + 1):
        row = {"round": r, "test_acc": 0.5 + r / 100, "train_loss": None}
        if extra and r >= 3:
            row["agg_gamma"] = r * 0.25  # a column that first appears in round 3
        log.append(row)
    return log


def test_rows_are_appended_to_the_file_and_not_kept_in_memory(tmp_path):
    log = _log(tmp_path / "m.csv", 3, extra=True)
    assert not hasattr(log, "rows")
    assert (tmp_path / "m.csv").read_bytes() == (b"round,test_acc,train_loss,agg_gamma\r\n"
                                                  b"1,0.51,,\r\n2,0.52,,\r\n3,0.53,,0.75\r\n")
    assert log.count == 3 and log.size == (tmp_path / "m.csv").stat().st_size
    assert log.read_rows()[2] == {"round": "3", "test_acc": "0.53", "train_loss": "", "agg_gamma": "0.75"}


def test_a_mark_is_small_and_cut_returns_the_file_byte_for_byte(tmp_path):
    path = tmp_path / "m.csv"
    log = _log(path, 2)
    mark, at_mark = log.mark(), path.read_bytes()
    assert set(mark) == {"rows", "bytes", "columns", "sha256"} and mark["rows"] == 2 and mark["bytes"] == len(at_mark)
    log.extend({"round": r, "test_acc": 0.9, "train_loss": 1.0} for r in (3, 4))  # written after the checkpoint
    resumed = CSVLog(path)
    resumed.cut(mark)
    assert path.read_bytes() == at_mark
    resumed.append({"round": 3, "test_acc": 0.53, "train_loss": None})
    assert path.read_bytes() == _log(tmp_path / "straight.csv", 3).path.read_bytes()
    assert resumed.mark() == CSVLog.mark(_log(tmp_path / "again.csv", 3))


def test_cut_undoes_a_header_widened_after_the_checkpoint(tmp_path):
    path = tmp_path / "m.csv"
    log = _log(path, 2)
    mark = log.mark()
    log.append({"round": 3, "test_acc": 0.53, "train_loss": None, "agg_gamma": 0.75})  # rewrites the header
    assert path.read_bytes().startswith(b"round,test_acc,train_loss,agg_gamma\r\n")
    resumed = CSVLog(path)
    resumed.cut(mark)
    assert path.read_bytes() == b"round,test_acc,train_loss\r\n1,0.51,\r\n2,0.52,\r\n"
    for r in range(3, 5):
        resumed.append({"round": r, "test_acc": 0.5 + r / 100, "train_loss": None, **({"agg_gamma": r * 0.25})})
    assert path.read_bytes() == _log(tmp_path / "straight.csv", 4, extra=True).path.read_bytes()


def test_cut_refuses_a_file_changed_before_the_mark_and_empties_at_a_zero_mark(tmp_path):
    path = tmp_path / "m.csv"
    mark = _log(path, 2).mark()
    path.write_bytes(path.read_bytes().replace(b"0.52", b"0.99"))
    with pytest.raises(ValueError) as err:
        CSVLog(path).cut(mark)
    assert str(err.value).splitlines()[0] == (
        f"{path} no longer holds the 2 rows the checkpoint recorded (it was changed or cut short after it); resume "
        "needs the run's files as it left them, or start the run again with overwrite=true")
    empty = CSVLog(path)
    empty.cut(CSVLog(tmp_path / "none.csv").mark())
    assert not path.exists() and empty.mark()["rows"] == 0
