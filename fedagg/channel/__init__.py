"""The upload channel: what a participating client sends, on its way to the aggregator.

A chain of stages run in list order, for every engine and every aggregator: compressors (with error
feedback as a wrapper), the corrupted clients' model attack at its position, clipping and noise. Each
stage has a client side on the round's updates and may have a server side on their aggregated mean.
"""

from fedagg.channel.base import AttackPosition, Compressor, Rule, Setup, Stage, Upload
from fedagg.channel.chain import Channel
from fedagg.channel.compress import QSGD, RandK, Sign, TopK
from fedagg.channel.errors import ErrorMemory
from fedagg.channel.feedback import ErrorFeedback
from fedagg.channel.privacy import DP

__all__ = ["DP", "QSGD", "AttackPosition", "Channel", "Compressor", "ErrorFeedback", "ErrorMemory", "RandK", "Rule",
           "Setup", "Sign", "Stage", "TopK", "Upload"]
