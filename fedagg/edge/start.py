"""Start Hydra on a command line; one line instead of Hydra's report for a command line it cannot compose.

A sweep's command line is checked before Hydra starts: a job that does not compose would otherwise fail after
the jobs before it trained. A single run's is checked only when Hydra stops before the run begins. Composing
it beforehand as well cost every run about half a second of start-up (the README's default run), and a command
line that composes needs no explanation.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import threading
from typing import Callable, Iterator, NoReturn

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra._internal.utils import run_and_report
from hydra.types import RunMode
from omegaconf import DictConfig, read_write

from fedagg.edge.command_line import explain_composition_error

FULL_ERROR = "HYDRA_FULL_ERROR"  # set, Hydra raises what stopped it instead of printing it and exiting
_NOT_SET = object()
_users_setting: object = _NOT_SET  # the user's own HYDRA_FULL_ERROR while a single run's set-up is watched


def is_sweep(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun", "hydra.mode=MULTIRUN") for a in argv)


def start(main: Callable[[], object], argv: list[str]) -> None:
    """Run Hydra's `main` on `argv` (sys.argv[1:]); a command line it cannot compose exits 2 with one line."""
    if is_sweep(argv):
        if (problem := explain_composition_error(argv)) is not None:
            _refuse(problem)
        main()
        return
    global _users_setting
    _users_setting = os.environ.get(FULL_ERROR)
    os.environ[FULL_ERROR] = "1"
    try:
        with composed_once():
            main()
    except Exception as err:  # noqa: BLE001 - raised before the run began (job_started restores the setting)
        job_started()
        if (problem := explain_composition_error(argv)) is not None:
            _refuse(problem)
        run_and_report(functools.partial(_raise, err))  # what Hydra would have printed, and its exit code
    finally:
        job_started()


@contextlib.contextmanager
def composed_once() -> Iterator[None]:
    """Hydra composes a single run's config twice: first in sweep mode only to read `hydra.mode` (a file may set
    it), then in run mode to run it (about 0.2 s each). Here the first composition is the run's own, in run mode,
    and the run takes it instead of composing again, with what Hydra would add (`hydra.mode=RUN`, recorded among
    the overrides; tested equal to Hydra's own). A command line that does not compose in run mode, or whose files
    make it a sweep, takes Hydra's own way."""
    get_mode, load = Hydra.get_mode, ConfigLoaderImpl.load_configuration
    kept: dict[tuple, DictConfig] = {}

    def mode_of_the_run(self, config_name, overrides):
        try:
            cfg = load(self.config_loader, config_name, list(overrides), RunMode.RUN)
        except Exception:  # noqa: BLE001 - Hydra's own way decides, and reports
            return get_mode(self, config_name, overrides)
        mode = cfg.hydra.mode
        if mode is None:  # Hydra runs `overrides` and `hydra.mode=RUN`
            with read_write(cfg.hydra):
                cfg.hydra.mode = RunMode.RUN
                cfg.hydra.overrides.hydra.append("hydra.mode=RUN")
            kept[(config_name, (*overrides, "hydra.mode=RUN"))] = cfg
        elif mode == RunMode.RUN:
            kept[(config_name, tuple(overrides))] = cfg
        return mode

    def load_kept(self, config_name, overrides, run_mode, from_shell=True, validate_sweep_overrides=True):
        if run_mode == RunMode.RUN and (config_name, tuple(overrides)) in kept:
            return kept.pop((config_name, tuple(overrides)))
        return load(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides)

    Hydra.get_mode, ConfigLoaderImpl.load_configuration = mode_of_the_run, load_kept
    try:
        yield
    finally:
        Hydra.get_mode, ConfigLoaderImpl.load_configuration = get_mode, load


def job_started() -> None:
    """The run's own code began: Hydra reports its errors as the user's environment asks (the task calls this)."""
    global _users_setting
    if _users_setting is _NOT_SET:
        return
    if _users_setting is None:
        os.environ.pop(FULL_ERROR, None)
    else:
        os.environ[FULL_ERROR] = str(_users_setting)
    _users_setting = _NOT_SET


def exit_now(code: object = 0) -> NoReturn:
    """End the process as `sys.exit(code)` would, without the interpreter's teardown: what the run made (a
    stacked sweep's 24 jobs, torch's state) need not be freed object by object before the process is gone (1.4 s
    at the end of a 24-job stacked sweep, 0.2 s of a single run). What the teardown does that matters is done
    first: the atexit functions (logging's files flushed and closed, partition pictures, W&B, a launcher's
    workers) and the standard streams flushed; fedagg writes its other files inside `with` blocks. While another
    thread that is not a daemon runs, the process exits the normal way, which waits for it."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): the message on stderr, status 1
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe that went away
            pass
    os._exit(status)


def _refuse(problem: str) -> None:
    print(problem, file=sys.stderr)  # Hydra's multi-line version would follow
    sys.exit(2)


def _raise(err: BaseException) -> None:
    raise err
