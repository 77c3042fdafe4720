"""Corrupted clients (`attack` group): which clients are corrupted, and what they do to their data or update."""
