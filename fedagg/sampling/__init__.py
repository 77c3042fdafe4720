"""Client selection: which of the clients that can take part train at a step (`sampler` group)."""
