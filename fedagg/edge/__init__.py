"""The Hydra edge beyond composing one run (which is `fedagg/run.py`): the one-line messages for a
command line Hydra cannot compose, the sweep's callback, and `python -m fedagg.compare`'s command line.
Only `fedagg/run.py`, this package and `hydra_plugins/` import Hydra; everything else is plain Python.
"""

from pathlib import Path

CONF = Path(__file__).resolve().parents[2] / "conf"
