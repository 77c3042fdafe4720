"""Sweeps that real runs write, through the command line as a user types it, for the tests of the results layer:
the same jobs through the basic launcher and stacked."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from conftest import ROOT


def cli_sweep(folder: Path, *args: str, env: dict | None = None) -> Path:
    """`python -m fedagg.run -m ARGS hydra.sweep.dir=FOLDER` with one torch thread (and `env`); the folder."""
    cmd = [sys.executable, "-m", "fedagg.run", "-m", *args, f"hydra.sweep.dir={folder}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


def basic_and_stacked(sweep: Callable[..., Path]):
    """Module fixtures `basic` and `stacked`: `sweep(folder, *extra)` run once a module, through each launcher."""

    @pytest.fixture(scope="module")
    def basic(tmp_path_factory) -> Path:
        return sweep(tmp_path_factory.mktemp("basic"))

    @pytest.fixture(scope="module")
    def stacked(tmp_path_factory) -> Path:
        return sweep(tmp_path_factory.mktemp("stacked"), "engine=parallel", "hydra/launcher=stacked")

    return basic, stacked


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
