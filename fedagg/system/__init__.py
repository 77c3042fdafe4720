"""Client systems: who is online, who reports back, and how many local steps each manages (`system` group)."""
