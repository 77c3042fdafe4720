"""Every example of README.md and the documentation site does what its page says (see tests/docs_examples.py).

Pages in `run` mode run their blocks in order in a fresh folder, at the small scale the `tiny` comment beside a
block states, and check the claims written under it; a block a `check` page marks `run` runs alone, the same way.
Every other `python -m fedagg.run` line of every page is composed and checked as the run would before training
(keys, types, ranges, the parts wired together): a line the docs show is never refused.
"""

from __future__ import annotations

import shlex

import pytest
from omegaconf import open_dict

from conftest import SHARED_DATA
from docs_examples import Block, blocks, environment, execute, page_mode, pages, run_lines, verify

MNIST = SHARED_DATA / "MNIST" / "raw" / "train-images-idx3-ubyte.gz"


def _runs(block: Block, mode: str) -> bool:
    if any(k in block.above for k in ("skip", "check-only", "needs", "slow")):
        return False
    return block.lang in ("bash", "python") and (mode == "run" or "run" in block.above)


def _run_pages() -> list:
    """Pages in `run` mode: their blocks run in order, in one folder."""
    out = []
    for page in pages():
        text, found = page.read_text(), blocks(page)
        if page_mode(text, page) == "run" and any(_runs(b, "run") for b in found):
            out.append(pytest.param(page, id=found[0].page))
    return out


def _run_blocks() -> list:
    """The blocks marked `run` on `check` pages: each its own test (the page's files written first), so that the
    suite's workers share them out; a block that reads an earlier command's folder holds that command too."""
    return [pytest.param(p, b, id=b.name) for p in pages() if page_mode(p.read_text(), p) != "run"
            for b in blocks(p) if _runs(b, "check") and not b.path]


def _needs_data() -> list:
    return [pytest.param(b, id=b.name) for p in pages() for b in blocks(p) if "needs" in b.above
            and "slow" not in b.above]


def _slow() -> list:
    return [pytest.param(p, b, id=b.name) for p in pages() for b in blocks(p) if "slow" in b.above]


@pytest.mark.slow
@pytest.mark.parametrize("page,block", _slow())
def test_slow_examples(page, block, tmp_path):
    """A block the page marks slow (its reason beside it), with the page's files; MNIST from the suite's copy."""
    if "needs" in block.above and not MNIST.exists():
        pytest.skip(f"MNIST's files are not at {MNIST.parent} (a user's run downloads them into ./data)")
    env = environment({"FEDAGG_DATA": str(SHARED_DATA.resolve())} if "needs" in block.above else None)
    for other in blocks(page):
        if other.path:
            execute(other, tmp_path, env)
    verify(block, tmp_path, execute(block, tmp_path, env, timeout=900))


def _checked_pages() -> list:
    return [pytest.param(p, id=blocks(p)[0].page if blocks(p) else p.name) for p in pages()
            if any(run_lines(b) for b in blocks(p) if b.lang == "bash")]


@pytest.mark.parametrize("page", _run_pages())
def test_page_examples_run(page, tmp_path):
    """The page's runnable blocks, in order, in one fresh folder (a later block reads what an earlier wrote)."""
    mode, env = page_mode(page.read_text(), page), environment()
    found = blocks(page)
    for block in found:
        if block.path:
            execute(block, tmp_path, env)
    ran = 0
    for block in found:
        if _runs(block, mode) and not block.path:
            verify(block, tmp_path, execute(block, tmp_path, env))
            ran += 1
    assert ran > 0


@pytest.mark.parametrize("page,block", _run_blocks())
def test_block_examples_run(page, block, tmp_path):
    """A block a `check` page marks `run`, at the scale its `tiny` comment gives, with its claims checked."""
    env = environment()
    for other in blocks(page):
        if other.path:
            execute(other, tmp_path, env)
    verify(block, tmp_path, execute(block, tmp_path, env))


@pytest.mark.parametrize("block", _needs_data())
def test_examples_with_dataset_files(block, tmp_path):
    """A block that reads MNIST's files: the test suite's copy, else skipped (a user's run downloads them)."""
    if block.above["needs"].strip() != "mnist":
        pytest.skip(f"needs {block.above['needs']}, which the tests do not have")
    if not MNIST.exists():
        pytest.skip(f"MNIST's files are not at {MNIST.parent} (a user's run downloads them into ./data)")
    env = environment({"FEDAGG_DATA": str(SHARED_DATA.resolve())})
    verify(block, tmp_path, execute(block, tmp_path, env))


def _compose_and_check(args: str) -> None:
    from hydra import compose, initialize_config_dir

    from fedagg.edge import CONF
    from fedagg.edge.command_line import explain_composition_error
    from fedagg.edge.job_checks import check_run

    argv = shlex.split(args)
    problem = explain_composition_error(argv)
    assert problem is None, problem
    # the first job of a sweep: each swept value's first
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
    lines = [f"{o.get_key_element()}={next(o.sweep_string_iterator())}" if o.is_sweep_override() else o.input_line
             for o in parsed if not o.key_or_group.startswith("hydra/launcher")
             and not o.key_or_group.startswith("hydra.launcher")]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=lines, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.overrides.task = lines
    check_run(cfg, parts=True)


@pytest.mark.parametrize("page", _checked_pages())
def test_page_commands_compose_and_pass_the_checks(page, tmp_path, monkeypatch):
    """Every `python -m fedagg.run` line of the page that is not run: composed and checked as before training."""
    import sys

    text = page.read_text()
    mode = page_mode(text, page)
    found = blocks(page)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # the reader's own modules (hydra.searchpath=[file://my_conf])
    for block in found:
        if block.path:
            execute(block, tmp_path, environment())
    checked, variables = 0, {}
    for block in found:
        if block.lang != "bash" or "skip" in block.above or _runs(block, mode):
            continue
        for args in run_lines(block, variables):
            try:
                _compose_and_check(args)
            except Exception as err:  # noqa: BLE001 - the message names the line
                raise AssertionError(f"{block.name}: python -m fedagg.run {args}\n  -> {err}") from None
            checked += 1
    for name in [m for m in sys.modules if m.startswith(("my_", "median_norm"))]:
        del sys.modules[name]
    assert checked >= 0
