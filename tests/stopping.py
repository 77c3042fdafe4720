"""An aggregator that stops its own run in round 2, for the tests of what a resumed run continues."""

import signal

from fedagg import FedAvg
from fedagg.aggregators.fedbuff import FedBuff


class StopInRound2(FedAvg):
    """FedAvg; while `armed`, its process gets one Ctrl-C in round 2: the run stops after that round's checkpoint."""

    armed = False

    def server_update(self, inputs, update):
        if inputs.round == 2 and StopInRound2.armed:
            StopInRound2.armed = False
            signal.raise_signal(signal.SIGINT)
        return super().server_update(inputs, update)


def stopped_in_round_2(train, cfg, folder):
    """`train(cfg, folder)` with StopInRound2 armed: the run's summary, interrupted after round 2's checkpoint."""
    StopInRound2.armed = True
    try:
        return train(cfg, folder)
    finally:
        StopInRound2.armed = False


class FedBuffStop(FedBuff):
    """FedBuff; while `at` is set, its process gets one Ctrl-C in that server step: the run stops after it."""

    at = None

    def server_update(self, inputs, update):
        if inputs.round == FedBuffStop.at:
            FedBuffStop.at = None
            signal.raise_signal(signal.SIGINT)
        return super().server_update(inputs, update)
