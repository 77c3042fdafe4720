"""Compose configs the way `python -m fedagg.run` does, without a Hydra app."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SHARED_DATA = ROOT.parent / "shared" / "data"


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def small_run():
    """Overrides for a quick run on the bundled digits."""
    return ["rounds=2", "device=cpu"]


needs_mnist = pytest.mark.skipif(
    not (SHARED_DATA / "MNIST" / "raw" / "train-images-idx3-ubyte.gz").exists(), reason="shared MNIST files not present"
)
