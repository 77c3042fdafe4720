"""The stacked launcher's console and log files: a group's jobs run in one process, so one console shows the lines
of all of them and each job's log file takes only its own (`serving`). The console numbers a job's lines, says the
start-up lines the jobs share once (fedagg.edge.start_up), and a table maps each job's number to its settings."""

import contextlib
import copy
import logging
import logging.config
from contextvars import ContextVar
from typing import Sequence

from hydra.core.utils import filter_overrides
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from fedagg.edge.start_up import SaidOnce

_serving: ContextVar[object] = ContextVar("serving", default=None)  # the job whose work the launcher does now


def console_logging(job_logging: DictConfig, start_up: SaidOnce) -> None:
    """The jobs' logging without its file handlers (each job adds its own: `job_log_files`); on the console a line
    says which job it is of (`#3 round 2/5 ...`), and a job's start-up line that an earlier job said alike is left
    out (`start_up`); each job's own log file keeps all of its lines."""
    conf = OmegaConf.to_container(job_logging, resolve=False)
    files = [name for name, h in conf.get("handlers", {}).items() if "filename" in h]
    for name in files:
        del conf["handlers"][name]
    if conf.get("root"):
        conf["root"]["handlers"] = [h for h in conf["root"].get("handlers", []) if h not in files]
        logging.config.dictConfig(conf)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.addFilter(start_up)
            handler.setFormatter(JobNumbered(handler.formatter or logging.Formatter()))


class JobNumbered(logging.Formatter):
    """The console's format, with `#N ` before a line the launcher logged for job N (the job table maps N to its
    settings)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        job = _serving.get()
        if job is None:
            return self.inner.format(record)
        numbered = copy.copy(record)  # the job's file handler formats the record as it is
        numbered.msg, numbered.args = f"#{job.config.hydra.job.num} {record.getMessage()}", None
        return self.inner.format(numbered)


def job_table(job_overrides: Sequence[Sequence[str]], first: int) -> list[str]:
    """The lines that map a job's number to its settings: the overrides that differ between the jobs (those they
    share are said once, above them)."""
    shown = [filter_overrides(list(o)) for o in job_overrides]
    shared = [o for o in shown[0] if all(o in others for others in shown[1:])] if len(shown) > 1 else []
    lines = [f"every job: {' '.join(shared)}"] if shared else []
    return lines + [f"#{first + i} {' '.join(o for o in overrides if o not in shared)}" for i, overrides in enumerate(shown)]


@contextlib.contextmanager
def serving(job: "stacked_launcher._Job"):
    """Within: the launcher works for `job` (prepares it, steps its loop, ends it): log lines go to its file."""
    token = _serving.set(job)
    try:
        yield
    finally:
        _serving.reset(token)


def job_log_files(config: DictConfig, job: "stacked_launcher._Job") -> list[logging.Handler]:
    """The job's file handlers of its job_logging (e.g. <run dir>/run.log), taking only the lines logged while the
    launcher serves that job."""
    conf = OmegaConf.to_container(config.hydra.job_logging, resolve=True) if config.hydra.job_logging else {}
    handlers = []
    for h in conf.get("handlers", {}).values():
        if "filename" not in h:
            continue
        handler = get_class(h.get("class", "logging.FileHandler"))(h["filename"])  # fedagg's RunLog: run_log.py
        fmt = conf.get("formatters", {}).get(h.get("formatter"), {}).get("format")
        handler.setFormatter(logging.Formatter(fmt))
        handler.addFilter(lambda record: _serving.get() is job)
        handlers.append(handler)
        logging.getLogger().addHandler(handler)
    return handlers
