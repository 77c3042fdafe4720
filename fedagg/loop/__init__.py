"""The round: its two phases (`RoundLoop.begin`/`end`), the drivers that run them, assembly, the inputs provider, diagnostics."""
