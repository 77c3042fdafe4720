"""Settings whose arithmetic would leave the finite numbers (a time, an optimizer's state, an image size) are
refused in one line before round 1: never a traceback, never inf or NaN in the files."""

import subprocess
import sys

import pytest

from conftest import ROOT, compose_config
from fedagg.models.resnet_gn import ResNet18GN
from fedagg.models.resnet_imagenet import ResNet18
from fedagg.run import train


def test_an_overflowing_clock_is_one_line_on_the_command_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fedagg.run", "dataset=digits", "rounds=1", "device=cpu",
                           "clock=lognormal", "clock.sigma=1e3", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0
    said = done.stdout + done.stderr  # Hydra's log goes to stdout
    assert "Traceback" not in said and "OverflowError" not in said, said
    lines = [line for line in said.splitlines() if line.strip()]
    assert lines[-1].endswith("clock.median=1.0, clock.sigma=1e3 are not allowed together: the slowest client's "
                              "local step would last more seconds than a float64 holds, and simulated times stay "
                              "finite only up to 1e+100 seconds a step; lower clock.median or clock.sigma"), lines
    assert not (tmp_path / "run" / "metrics.csv").exists()


@pytest.mark.parametrize("overrides, message", [
    ("model=resnet18 model.input_size=0", "model.input_size=0 is not allowed; it must be an integer >= 1 (pixels a "
                                          "side), or null for the images' own size"),
    ("model=resnet18 model.input_size=-5", "model.input_size=-5 is not allowed; it must be an integer >= 1"),
    # ignored by the cifar stem, yet a mistake wherever it is typed (it used to train)
    ("model=resnet18_gn model.input_size=-1", "model.input_size=-1 is not allowed; it must be an integer >= 1"),
    ("aggregator=fedadam aggregator.v_init=1e300", "aggregator.v_init=1e+300 is not allowed; use a number in [0, 1e+38]"),
    ("aggregator=fedadam aggregator.tau=1e300", "aggregator.tau=1e+300 is not allowed; it must be a number in [0, 1e+19]"),
])
def test_values_beyond_what_the_arithmetic_holds_are_one_line(tmp_path, overrides, message):
    with pytest.raises(ValueError) as err:
        train(compose_config("dataset=digits", "rounds=1", "device=cpu", *overrides.split()), tmp_path)
    assert type(err.value).__name__ == "SetupError"
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "metrics.csv").exists()


def test_a_resnet_built_from_python_refuses_a_size_below_one():
    with pytest.raises(ValueError, match=r"^model.input_size=0 is not allowed"):
        ResNet18(num_classes=10, in_channels=3, image_size=32, input_size=0)
    with pytest.raises(ValueError, match=r"^model.input_size=-1 is not allowed"):
        ResNet18GN(num_classes=10, in_channels=3, image_size=32, input_size=-1)
    assert ResNet18(num_classes=10, in_channels=1, image_size=8, input_size=1).input_shape == (3, 1, 1)
