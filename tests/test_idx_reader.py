"""MNIST's IDX files are read without torchvision, to exactly the tensors torchvision's reader gives."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedagg.data.datasets import MNIST_FILES, _idx_root, mnist, read_idx
from fedagg.data.files import DataError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
needs_mnist = pytest.mark.skipif(not (DATA / "MNIST" / "raw").is_dir(), reason="the canonical MNIST copy is absent")


@needs_mnist
def test_mnist_equals_torchvision_reader():
    from torchvision.datasets import MNIST

    ours = mnist(str(DATA), mean=[0.1307], std=[0.3081])
    base = _idx_root(MNIST_FILES, "mnist", DATA.resolve(), False)
    for train, x, y in ((True, ours.train_x, ours.train_y), (False, ours.test_x, ours.test_y)):
        theirs = MNIST(str(base), train=train)
        assert torch.equal(x, theirs.data.unsqueeze(1)) and torch.equal(y, theirs.targets.long())
    assert ours.train_x.shape == (60000, 1, 28, 28) and ours.train_y[:5].tolist() == [5, 0, 4, 1, 9]


@needs_mnist
def test_mnist_run_imports_no_torchvision():
    code = (f"import sys; from fedagg.data.datasets import mnist; mnist({str(DATA)!r}, mean=[0.1], std=[0.3]); "
            "print('torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("code,dtype", [(0x0B, ">i2"), (0x0C, ">i4"), (0x0D, ">f4"), (0x0E, ">f8"), (0x08, "u1")])
def test_big_endian_values_and_shape(tmp_path, code, dtype):
    values = (np.arange(24).reshape(2, 3, 4) * 3 - 7).astype(dtype) if dtype != "u1" else np.arange(24, dtype="u1").reshape(2, 3, 4)
    path = tmp_path / "x"
    path.write_bytes(bytes([0, 0, code, 3]) + b"".join(s.to_bytes(4, "big") for s in values.shape) + values.tobytes())
    got = read_idx(path)
    assert got.shape == (2, 3, 4)
    assert got.flatten()[:3].tolist() == ([0, 1, 2] if dtype == "u1" else [-7, -4, -1])


def test_wrong_length_and_foreign_file_refused(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + bytes(9))  # one byte short
    with pytest.raises(ValueError, match="holds 17 bytes where its header promises 18"):
        read_idx(path)
    path.write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(path)


def test_cut_short_copy_is_named(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES.files:
        images = "images" in name
        count = 60000 if name.startswith("train") else 10000
        header = bytes([0, 0, 8, 3 if images else 1]) + count.to_bytes(4, "big") + (
            (28).to_bytes(4, "big") * 2 if images else b"")
        (raw / name).write_bytes(header + bytes(100))  # far shorter than the header says
    with pytest.raises(DataError, match="train-images-idx3-ubyte"):
        mnist(str(tmp_path), mean=[0.1], std=[0.3])
