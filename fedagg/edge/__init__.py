"""The Hydra edge beyond composing one run (which is `fedagg/run.py`): the one-line messages for a
command line Hydra cannot compose, and the sweep's callback. Only `fedagg/run.py` and this package
import Hydra; everything else is plain Python.
"""

from pathlib import Path

CONF = Path(__file__).resolve().parents[2] / "conf"
