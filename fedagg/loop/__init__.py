"""The round loop and its companions: assembly, the inputs provider, checkpoints, interrupts, progress, diagnostics."""
