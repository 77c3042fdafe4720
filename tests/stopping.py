"""An aggregator that stops its own run in round 2, for the tests of what a resumed run continues."""

import signal

from fedagg import FedAvg


class StopInRound2(FedAvg):
    """FedAvg; while `armed`, its process gets one Ctrl-C in round 2: the run stops after that round's checkpoint."""

    armed = False

    def server_update(self, inputs, update):
        if inputs.round == 2 and StopInRound2.armed:
            StopInRound2.armed = False
            signal.raise_signal(signal.SIGINT)
        return super().server_update(inputs, update)
