"""The documentation site: every option of conf/ has its reference entry, the site builds in strict mode (no broken
link, anchor or API object), and three of its pages render in headless Chromium as a reader sees them.

Chromium is Debian's package (`.ci/run` installs it); without it the rendering test is skipped with that reason.
`FEDAGG_SCREENSHOTS=DIR` keeps the screenshots there (else they go to the test's temporary folder).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from conftest import CONF, ROOT

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings")

META = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_", "defaults"}


def _keys(node: dict, prefix: str = "") -> list[str]:
    """Every setting of an option, as the reference names it (a nested option's keys under its name)."""
    out = []
    for key, value in (node or {}).items():
        if key in META:
            continue
        if isinstance(value, dict) and "_target_" in value:
            out += _keys(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def _conf_options() -> list[tuple[str, str, list[str]]]:
    """(group, option, keys) for every YAML of conf/, read with plain YAML (not with the generator's reader)."""
    out = []
    for path in sorted(CONF.rglob("*.yaml")):
        group = path.parent.relative_to(CONF).as_posix()
        if path.parent == CONF or group.split("/")[0] == "hydra":
            continue
        out.append((group, path.stem, _keys(yaml.safe_load(path.read_text()))))
    return out


def _sections(page: str) -> dict[str, str]:
    """An option's section of a generated group page: `## name` up to the next."""
    parts = re.split(r"^## (\S+)\s*$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_option_in_conf_has_a_reference_entry():
    from fedagg import reference

    pages = reference.pages()
    options = _conf_options()
    assert len(options) > 100 and sum(len(k) for _, _, k in options) > 300  # the walk found conf/ itself
    missing = []
    for group, name, keys in options:
        page = pages.get(f"reference/{group.replace('/', '-')}.md")
        section = _sections(page).get(name) if page else None
        if section is None:
            missing.append(f"{group}={name}")
            continue
        missing += [f"{group}={name}: {key}" for key in keys if f"| `{key}` |" not in section]
    top = yaml.safe_load((CONF / "config.yaml").read_text())
    settings = pages["reference/settings.md"]
    for key, value in top.items():
        if key in ("defaults", "hydra"):
            continue
        for sub in ([f"{key}.{k}" for k in value] if isinstance(value, dict) else [key]):
            if f"| `{sub}` |" not in settings:
                missing.append(f"top-level {sub}")
    assert not missing, f"{len(missing)} options of conf/ have no reference entry: {missing[:20]}"


def test_a_reference_entry_gives_the_default_the_accepted_values_and_the_meaning():
    from fedagg import reference

    fedbuff = _sections(reference.pages()["reference/aggregator.md"])["fedbuff"]
    # default from the YAML, accepted values from the constructor's Literal, meaning from the YAML comment
    row = next(line for line in fedbuff.splitlines() if line.startswith("| `optimizer` |"))
    assert "`sgd`" in row and "sgd, avgm, adam, yogi, adagrad" in row and "FedOpt Alg. 2" in row
    row = next(line for line in fedbuff.splitlines() if line.startswith("| `buffer_size` |"))
    assert "`10`" in row and "integer" in row and "K arrivals per server step" in row
    assert "Nguyen et al., AISTATS 2022" in fedbuff  # the module's docstring: the paper
    dp = _sections(reference.pages()["reference/channel.md"])["dp"]
    assert "| `dp.noise_multiplier` | `1.0` |" in dp


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_the_site_builds_in_strict_mode_with_every_page(site):
    assert (site / "index.html").exists()
    for page in ("get-started/first-run", "tutorials/own-objective", "how-to/own-dataset", "reference/aggregator",
                 "reference/api", "explanations/design", "methods"):
        assert (site / page / "index.html").exists(), page
    text = (site / "reference" / "aggregator" / "index.html").read_text()
    assert "fedbuff" in text and "buffer_size" in text
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "run_experiment" in api and "RoundInputs" in api  # mkdocstrings found the objects
    for path in site.rglob("*.html"):  # user documentation names nothing outside the repository
        body = path.read_text()
        assert "../shared" not in body and "SPEC.md" not in body and not re.search(r"\b[\w-]+\.txt\b", body), path


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--window-size=1280,1000", "--enable-logging=stderr", "--v=0"]


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # noqa: D401 - the test's output is the page's, not the server's
        pass


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120)


def _console_errors(stderr: str) -> list[str]:
    """The page's console messages. Chromium's log gives every one the level INFO (console.error's too), so any
    is counted: the site's pages log nothing when they work."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def test_console_messages_are_found_in_chromiums_log():
    log = ('[1:1:1128/153227.384250:INFO:CONSOLE:1] "boom", source: file:///tmp/i.html (1)\n'
           "[1:1:1128/153227.385:WARNING:sandbox] unrelated\n"
           '[1:1:1128/153227.385668:INFO:CONSOLE:1] "Uncaught ReferenceError: f is not defined", source: x (1)\n')
    assert len(_console_errors(log)) == 2
    assert _console_errors("[1:1:1128/1.0:WARNING:gpu] nothing from the page\n") == []


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium; .ci/run "
                                             "installs it)")
@pytest.mark.parametrize("page,title,expect", [
    ("", "fedagg", "Where to start"),
    ("tutorials/own-objective/", "Your own client objective", "LogitPenalty"),
    ("reference/aggregator/", "aggregator", "buffer_size"),
])
def test_a_page_renders_in_headless_chromium(served, page, title, expect, tmp_path):
    from PIL import Image

    keep = Path(os.environ.get("FEDAGG_SCREENSHOTS", tmp_path))
    keep.mkdir(parents=True, exist_ok=True)
    shot = keep / f"{(page.strip('/') or 'index').replace('/', '_')}.png"
    url = f"{served}/{page}"
    dom = _chromium(["--dump-dom", url], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert title in dom.stdout and expect in dom.stdout, "the page's content is missing"
    assert 'class="md-nav' in dom.stdout and "Tutorials" in dom.stdout and "Reference" in dom.stdout, \
        "the navigation is missing"
    assert not _console_errors(dom.stderr), _console_errors(dom.stderr)
    done = _chromium([f"--screenshot={shot}", url], tmp_path / "profile-shot")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert not _console_errors(done.stderr), _console_errors(done.stderr)
    image = Image.open(shot).convert("L")
    assert image.size == (1280, 1000)
    colours = image.getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 20, "a blank page"  # text, navigation and header: many shades
    dark = sum(count for count, level in colours or [] if level < 128)
    assert colours is None or dark > 2000, "a page without text"
