"""fedagg's stacked launcher for Hydra sweeps (`hydra/launcher=stacked`), found by Hydra in `hydra_plugins`."""
