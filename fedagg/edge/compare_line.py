"""`python -m fedagg.compare`'s command line: the protocol's keys become the settings of the `fedagg_compare` Hydra
sweeper, Hydra's own options go first, every other argument is a run override; `--help` lists the protocol's
keys with their defaults (CompareSweeperConf's)."""

from __future__ import annotations

import runpy
import sys

from hydra._internal.utils import get_args_parser

from fedagg.edge.compare_keys import protocol_keys

DEFAULT_FOLDER = "outputs/compare/${now:%Y-%m-%d}/${now:%H-%M-%S}"
HELP = ("--help", "-h")
# Hydra takes one of these at a time: with --cfg or --info the comparison is shown, not run (no -m added)
MODES = ("--multirun", "-m", "--run", "-r", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc")


def _hydra_options() -> dict[str, object]:
    """Hydra's command-line options (--config-dir, -cd, --cfg, --info, ...) -> their argparse action."""
    return {name: action for action in get_args_parser()._actions for name in action.option_strings}


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's options with their values, the overrides). Hydra's parser takes the overrides as one run of
    positional arguments: an option between two overrides would leave the second run unparsed."""
    options, overrides, known = [], [], _hydra_options()
    args = iter(argv)
    for arg in args:
        name = arg.split("=", 1)[0]
        action = known.get(name) if arg.startswith("-") else None
        if action is None:
            (options if arg.startswith("-") else overrides).append(arg)  # an unknown option: Hydra names it
            continue
        options.append(arg)
        if "=" in arg or action.nargs == 0:  # --config-dir=X, or a flag (--resolve, -m)
            continue
        if action.nargs is None:  # a value follows: --config-dir X, -cd X, --cfg job
            options.append(next(args, ""))
        elif action.nargs == "?":  # --info [WHAT]: a value only if it is one Hydra accepts
            following = next(args, None)
            if following is not None and following in (action.choices or ()):
                options.append(following)
                continue
            if following is not None:
                overrides.append(following)
            options[-1] = f"{arg}={action.const}"  # its own value: the override after it would be taken for one
    return [o for o in options if o != ""], overrides


def translate(argv: list[str]) -> list[str]:
    """fedagg.run's command line for the comparison's."""
    options, overrides = split(argv)
    shown = any(o.split("=", 1)[0] in MODES for o in options)
    out = [*([] if shown else ["-m"]), *options, "hydra/sweeper=fedagg_compare"]
    if not any(a.startswith("hydra.sweep.dir=") for a in overrides):
        out.append(f"hydra.sweep.dir={DEFAULT_FOLDER}")
    keys = protocol_keys()
    for arg in overrides:
        out.append(f"hydra.sweeper.{arg}" if arg.split("=", 1)[0] in keys else arg)
    return out


def _shown(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def help_text() -> str:
    keys = protocol_keys()
    width = max(len(f"{k}={_shown(d)}") for k, (d, _) in keys.items())
    rows = [f"  {f'{k}={_shown(d)}':<{width}}  {line}" for k, (d, line) in keys.items()]
    return "\n".join([
        "usage: python -m fedagg.compare methods=[NAME,...] [KEY=VALUE ...] [--config-dir DIR] [--cfg job] ...",
        "",
        "Tunes every method with the same budget on validation data, picks each one's best configuration, and",
        "confirms the choices and the defaults on fresh seeds on the test set (README: Fair comparisons).",
        "",
        "The comparison's keys, with their defaults:",
        *rows,
        "",
        "Every other argument is a run override, as for python -m fedagg.run: groups (dataset=mnist), keys",
        "(rounds=30 partition.alpha=0.1), experiment files (+experiment=NAME), your own methods' folder",
        "(hydra.searchpath=[file://DIR]), a launcher (hydra/launcher=joblib). A key a method tunes, set here, is",
        "fixed instead. `python -m fedagg.run --help` lists the groups and their options and shows the config.",
        "Hydra's options (--config-dir DIR, --cfg job, --info, ...) may stand anywhere.",
        "The comparison's folder is hydra.sweep.dir (default outputs/compare/<date>/<time>);",
        "the same command with the same hydra.sweep.dir continues a stopped comparison.",
    ])


def needs_optuna() -> None:
    """The comparison's studies are Optuna's (the optional extra): without it, one line before Hydra starts."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        print("python -m fedagg.compare needs Optuna for its tuning studies: pip install 'fedagg[compare]' "
              "(or pip install optuna)", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    options, _ = split(argv)
    if any(o in HELP for o in options):
        print(help_text())
        return
    needs_optuna()
    sys.argv = ["fedagg.run", *translate(argv)]
    runpy.run_module("fedagg.run", run_name="__main__", alter_sys=True)
