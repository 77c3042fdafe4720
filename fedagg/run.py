"""The Hydra edge: compose the config, instantiate the parts, run the federation.

`python -m fedagg.run [group=option ...] [key=value ...]` (add `-m` for a sweep). Only this
module imports Hydra; `train(cfg, run_dir)` is callable from tests with a composed config.
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedagg.data.device import DeviceData
from fedagg.data.partition_report import partition_stats, save_partition_report
from fedagg.federation import (
    Settings,
    build_model,
    effective_val_frac,
    hold_out_server_split,
    make_clients,
    resolve_device,
)
from fedagg.seeding import generator
from fedagg.simulation import Federation, run_federation
from fedagg.tracking.files import write_json

GROUPS = ("dataset", "partition", "model", "aggregator", "client", "logger", "engine")
log = logging.getLogger("fedagg")


class SetupError(ValueError):
    """The configuration or the data cannot make a run; the message says which key and why."""


def settings_from(cfg: DictConfig) -> Settings:
    return Settings(
        seed=cfg.seed,
        rounds=cfg.rounds,
        num_clients=cfg.num_clients,
        clients_per_round=cfg.clients_per_round,
        eval_every=cfg.eval_every,
        target_acc=cfg.target_acc,
    )


def train(cfg: DictConfig, run_dir: str | Path, choices: dict | None = None) -> dict:
    """Run one experiment described by a composed config; write its result files to run_dir."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = OmegaConf.to_container(cfg, resolve=True)
    summary_base = {"seed": cfg.seed, "choices": choices or {}, "config": config}
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    tracker = None
    stage = "setup"
    try:
        # everything that can reject the configuration is built before any data is loaded
        settings = settings_from(cfg)
        device = resolve_device(cfg.device)
        aggregator = instantiate(cfg.aggregator)
        trainer = instantiate(cfg.client)
        engine = instantiate(cfg.engine)
        partition = instantiate(cfg.partition)
        model_factory = instantiate(cfg.model)
        tracker = instantiate(cfg.logger)

        bundle = instantiate(cfg.dataset)(root=str(Path(cfg.data.root).expanduser()))
        server_idx, pool = hold_out_server_split(
            bundle.train_y.numel(), int(getattr(aggregator, "server_samples", 0)), settings.seed
        )
        pool_labels = bundle.train_y[pool]
        parts = partition(pool_labels, settings.num_clients, generator=generator(settings.seed, "partition"))
        save_partition_report(partition_stats(pool_labels, parts, bundle.num_classes), run_dir)
        model = build_model(model_factory, bundle, settings.seed, device)
        data = DeviceData(bundle, device, model.input_shape)
        val_frac = effective_val_frac(trainer.val_frac, aggregator)
        clients = make_clients([pool[p] for p in parts], val_frac, settings.seed, device)
        log.info(
            "%s: %d train / %d test samples, %d clients, %s with %d parameters on %s",
            bundle.name, bundle.train_y.numel(), bundle.test_y.numel(), len(clients),
            type(model).__name__, sum(p.numel() for p in model.parameters()), device,
        )
        tracker.start(run_dir, config, name=run_dir.name)
        tracker.log_image("partition", run_dir / "partition.png")
        fed = Federation(data, model, clients, aggregator, trainer, engine, tracker, server_idx.to(device))
        stage = "training"
        summary = run_federation(fed, settings, run_dir, summary_base)
    except Exception as err:
        # the metrics already written stay; the summary says what went wrong
        write_json(run_dir / "summary.json", dict(summary_base, status="failed", error=f"{type(err).__name__}: {err}",
                                                  traceback=traceback.format_exc()))
        if tracker is not None:
            tracker.finish({"status": "failed"})
        cause = err.__cause__ if isinstance(err, InstantiationException) else err  # a constructor's own message
        if stage == "setup" and isinstance(cause, (ValueError, FileNotFoundError)):
            raise SetupError(str(cause)) from err
        raise
    tracker.finish(summary)
    log.info("%s: final test accuracy %.4f after %d rounds (%s)", summary["status"],
             summary["final_test_acc"] or 0.0, summary["rounds_completed"], run_dir)
    return summary


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if k in GROUPS or k == "experiment"}
    try:
        train(cfg, hydra_cfg.runtime.output_dir, choices)
    except SetupError as err:
        # a user error, not a bug: the message alone, without a traceback
        log.error("%s", err)
        sys.exit(2)


if __name__ == "__main__":
    main()
