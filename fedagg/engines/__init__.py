"""Engines run a round of local training: one client at a time, or all of a round's clients stacked."""
