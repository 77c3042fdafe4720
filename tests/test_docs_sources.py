"""What the Reference shows is written for a reader of a clone: no file outside the repository, no developers' notes.

The Reference pages are generated from `conf/` (every YAML file's comments and values) and from docstrings (each
option's module, the objects of docs/reference/api.md). Those sources cite a paper by its authors, venue and year,
never by the name of a local text copy (`fedadp.txt`), a folder beside the clone (`../shared/...`) or the
developers' design notes (`SPEC`). The sources are read as written, so a rewrite at build time cannot hide them.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from fedagg import reference

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\.\./shared|\bSPEC\b|\b[\w.-]+\.txt\b")


def _hits(where: str, text: str | None) -> list[str]:
    return [f"{where}: ...{text[max(0, m.start() - 50):m.end() + 30]}...".replace("\n", " ")
            for m in OUTSIDE.finditer(text or "")]


def _yaml_files() -> list[Path]:
    groups = [p for g in reference.groups() for p in sorted((reference.CONF / g).glob("*.yaml"))]
    return [reference.CONF / "config.yaml", *groups]


def _option_modules() -> dict[str, object]:
    found = {}
    for group in reference.groups():
        for opt in reference.options(group):
            if opt.target:
                try:
                    module = inspect.getmodule(reference._locate(opt.target))
                except (ImportError, AttributeError):  # an extra not installed: its page shows no docstring
                    continue
                found[module.__name__] = module
    return found


def _api_objects() -> dict[str, object]:
    found = {}
    for line in (ROOT / "docs" / "reference" / "api.md").read_text().splitlines():
        if line.startswith("::: "):
            name = line[4:].strip()
            try:
                obj = importlib.import_module(name)
            except ImportError:
                obj = reference._locate(name)
            found[name] = obj
            home = obj.__name__ if inspect.ismodule(obj) else obj.__module__
            for member_name, member in inspect.getmembers(obj):
                if member_name.startswith("_") or not (inspect.isroutine(member) or inspect.isclass(member)
                                                       or isinstance(member, property)):
                    continue
                if getattr(member, "__module__", home) == home:  # what mkdocstrings renders, not what is imported
                    found[f"{name}.{member_name}"] = member
    return found


def test_the_pattern_finds_what_it_is_for():
    assert _hits("x", "as fedadp.txt eq. 7 (SPEC \"FedAdp\"), files in ../shared/papers") != []
    assert len(_hits("x", "fedadp.txt; SPEC; ../shared/data")) == 3
    assert _hits("x", "Wu & Wang, IEEE TCCN 2021, eq. 7; the SPECTRUM of a text") == []


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(reference.CONF)))
def test_conf_files_cite_papers_not_local_files(path):
    """A YAML file's comments and values: its page shows the header, each key's comment and each default."""
    hits = _hits(str(path.relative_to(ROOT)), path.read_text())
    assert not hits, "\n".join(hits)


def test_option_module_docstrings_cite_papers_not_local_files():
    """The docstring of each option's module, shown under its entry ("Paper, authors' code and checks")."""
    modules = _option_modules()
    assert len(modules) > 40  # every group's options resolved (aggregators alone are more)
    hits = [h for name, module in modules.items() for h in _hits(name, inspect.getdoc(module))]
    assert not hits, "\n".join(hits)


def test_api_page_docstrings_cite_papers_not_local_files():
    objects = _api_objects()
    assert "fedagg.aggregators.base.Aggregator" in objects and len(objects) > 20
    hits = [h for name, obj in objects.items() for h in _hits(name, inspect.getdoc(obj))]
    assert not hits, "\n".join(hits)


def test_generated_pages_show_the_sources_unchanged():
    """No rewrite between the sources and the pages: a comment appears on its page as written."""
    pages = reference.pages()
    hits = [h for path, text in pages.items() for h in _hits(path, text)]
    assert not hits, "\n".join(hits)
    header = (reference.CONF / "aggregator" / "fedadp.yaml").read_text().splitlines()[0].lstrip("# ").strip()
    assert header in pages["reference/aggregator.md"]
