"""What a run needs around its rounds: its folder and checkpoints, stopping on a signal, torch's threads and
numerics, the progress bar. Nothing here knows what a round computes (that is `fedagg.loop`)."""
