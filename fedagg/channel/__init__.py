"""The upload channel: what a participating client sends, on its way to the aggregator (SPEC "Upload channel").

One stage after local training, for every engine and every aggregator: compression with
per-client error feedback, the corrupted clients' model attacks, clipping and noise.
"""

from fedagg.channel.base import Channel, Setup, Stage
from fedagg.channel.compress import QSGD, RandK, Sign, TopK
from fedagg.channel.errors import ErrorMemory
from fedagg.channel.privacy import DP

__all__ = ["DP", "QSGD", "Channel", "ErrorMemory", "RandK", "Setup", "Sign", "Stage", "TopK"]
