"""The reference of every configuration option, read from `conf/` and the code at the time the site is built.

Each YAML file under `conf/<group>/` is one option of its group. For every key it holds, the entry gives the
default (the YAML value), the accepted values (the annotation of the parameter of the constructor its
`_target_` names: `Range`, `Literal`, a plain type) and the meaning (the YAML comment on that key). The file's
own header comment and its module's docstring (the paper and the authors' code it was checked against) follow.
Nothing is listed by hand, so a group or option added to `conf/` appears without an edit here, and
`tests/test_docs_reference.py` checks that every key has its entry. `docs/hooks.py` turns the pages into the
site's Reference section.
"""

from __future__ import annotations

import inspect
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from fedagg.config.constraints import _without_none, constraints

CONF = Path(__file__).resolve().parents[1] / "conf"
META = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_", "defaults"}
SKIP_GROUPS = ("hydra",)  # Hydra's own logging and launcher settings, described on the how-to pages
_KEY = re.compile(r"^(\s*)(?:- )?([A-Za-z_][\w.-]*):(.*)$")


@dataclass
class Entry:
    key: str  # dotted, relative to the option (dp.clip)
    default: str
    accepted: str
    meaning: str


@dataclass
class Option:
    group: str  # client/objective
    name: str
    target: str | None
    about: str  # the YAML file's header comment
    source: str  # the target's module docstring: paper, authors' code
    entries: list[Entry] = field(default_factory=list)


def groups(conf: Path = CONF) -> list[str]:
    """Every folder of `conf/` holding YAML options, nested ones as `client/objective`."""
    found = sorted({str(p.parent.relative_to(conf)) for p in conf.rglob("*.yaml") if p.parent != conf})
    return [g for g in found if g.split("/")[0] not in SKIP_GROUPS]


def _comments(path: Path) -> tuple[str, dict[str, str]]:
    """(the header comment, dotted key -> its comment and the comment lines continuing it)."""
    lines = path.read_text().splitlines()
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            header.append(line[1:].strip())
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last, column = None, -1
    for line in lines:
        stripped = line.lstrip()
        if stripped.startswith("#"):
            if last is not None and line.index("#") == column:  # a continuation aligned with the key's comment
                comments[last] += " " + stripped[1:].strip()
            continue
        last, column = None, -1
        match = _KEY.match(line)
        if not match:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        stack = [(i, k) for i, k in stack if i < indent]
        dotted = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        hash_at = re.search(r"\s#", rest)
        if hash_at:
            comments[dotted] = rest[hash_at.end():].strip()
            last, column = dotted, len(line) - len(rest) + hash_at.end() - 1
    return " ".join(header), comments


def _type_words(hint) -> str:
    hint, nullable = _without_none(hint)
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
        hint, inner_null = _without_none(hint)
        nullable = nullable or inner_null
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    words = names.get(hint)
    if words is None:
        origin = typing.get_origin(hint)
        words = {list: "a list", tuple: "a list", dict: "a mapping"}.get(origin or hint, "")
    return f"{words} or null" if words and nullable else words


def _accepted(function, name: str) -> str:
    try:
        hints = typing.get_type_hints(function, include_extras=True)
        declared = constraints(function)
    except (NameError, TypeError):
        return ""
    if name in declared:
        constraint, nullable = declared[name]
        words = constraint.allowed.removeprefix("it must be ")
        return f"{words}; or null" if nullable else words
    return _type_words(hints[name]) if name in hints else ""


def _locate(path: str):
    module, _, attr = path.rpartition(".")
    return getattr(__import__(module, fromlist=[attr]), attr)


def _shown(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _node_entries(node: dict, prefix: str, comments: dict[str, str]) -> list[Entry]:
    target = node.get("_target_")
    function = None
    if target:
        try:
            found = _locate(target)
            function = found.__init__ if inspect.isclass(found) else found
        except (ImportError, AttributeError):  # an option whose extra is not installed: still listed
            function = None
    entries = []
    for key, value in node.items():
        if key in META:
            continue
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and "_target_" in value:
            entries += _node_entries(value, f"{dotted}.", comments)
            continue
        accepted = _accepted(function, key) if function is not None else ""
        if key == "display_name":
            accepted, meaning = "a string", comments.get(dotted) or "the method's name in tables, figures and W&B"
        else:
            meaning = comments.get(dotted, "")
        entries.append(Entry(dotted, _shown(value), accepted, meaning))
    return entries


def option(path: Path, conf: Path = CONF) -> Option:
    group = str(path.parent.relative_to(conf))
    about, comments = _comments(path)
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    target = node.get("_target_")
    source = ""
    if target:
        try:
            source = inspect.getdoc(inspect.getmodule(_locate(target))) or ""
        except (ImportError, AttributeError):
            source = ""
    opt = Option(group, path.stem, target, about, source)
    opt.entries = _node_entries(node, "", comments)
    return opt


def options(group: str, conf: Path = CONF) -> list[Option]:
    return [option(p, conf) for p in sorted((conf / group).glob("*.yaml"))]


def top_level(conf: Path = CONF) -> list[Entry]:
    """The keys of `conf/config.yaml` other than the groups and Hydra's own."""
    path = conf / "config.yaml"
    _, comments = _comments(path)
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    from fedagg.config.schema import DataKeys, EvalKeys, TopLevel

    def flat(d: dict, prefix: str, schema) -> list[Entry]:
        hints = typing.get_type_hints(schema)
        out = []
        for key, value in d.items():
            if key in META or key == "hydra":
                continue
            sub = {"data": DataKeys, "eval": EvalKeys}.get(key) if not prefix else None
            if isinstance(value, dict) and sub is not None:
                out += flat(value, f"{key}.", sub)
            else:
                words = _type_words(hints.get(key)) if key in hints else ""
                out.append(Entry(f"{prefix}{key}", _shown(value), words, comments.get(f"{prefix}{key}", "")))
        return out

    return flat(node, "", TopLevel)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or "—"


def _code(text: str) -> str:
    return f"`{text}`" if text and "`" not in text else _cell(text)


def group_page(group: str, conf: Path = CONF) -> str:
    lines = [f"# `{group}`", "",
             f"Every option of the `{group}` group, choose one with `{group}=NAME`; set a key with "
             f"`{group.replace('/', '.')}.KEY=VALUE`. Generated from `conf/{group}/` and the constructors' annotations "
             "when the site is built.", ""]
    for opt in options(group, conf):
        lines += [f"## {opt.name}", ""]
        if opt.about:
            lines += [opt.about, ""]
        if opt.target:
            lines += [f"Python: `{opt.target}`", ""]
        if opt.entries:
            lines += ["| key | default | accepted | meaning |", "|---|---|---|---|"]
            lines += [f"| `{e.key}` | {_code(e.default)} | {_cell(e.accepted)} | {_cell(e.meaning)} |" for e in opt.entries]
            lines.append("")
        if opt.source:
            lines += ['??? quote "Paper, authors\' code and checks (the module\'s docstring)"', "",
                      "    ```text"]
            lines += [f"    {line}".rstrip() for line in opt.source.splitlines()]
            lines += ["    ```", ""]
    return "\n".join(lines) + "\n"


def top_level_page(conf: Path = CONF) -> str:
    lines = ["# Top-level settings", "",
             "The keys of `conf/config.yaml` outside the groups, set as `KEY=VALUE`. Generated when the site is built.",
             "", "| key | default | accepted | meaning |", "|---|---|---|---|"]
    lines += [f"| `{e.key}` | {_code(e.default)} | {_cell(e.accepted)} | {_cell(e.meaning)} |" for e in top_level(conf)]
    return "\n".join(lines) + "\n"


def pages(conf: Path = CONF) -> dict[str, str]:
    """Site path -> markdown of every generated reference page."""
    out = {"reference/settings.md": top_level_page(conf)}
    for group in groups(conf):
        out[f"reference/{group.replace('/', '-')}.md"] = group_page(group, conf)
    index = ["# Options", "", "Generated from `conf/` and the code each time the site is built.", "",
             "- [Top-level settings](settings.md)"]
    index += [f"- [`{g}`]({g.replace('/', '-')}.md): {', '.join(p.stem for p in sorted((conf / g).glob('*.yaml')))}"
              for g in groups(conf)]
    index += ["- [Python API](api.md)"]
    out["reference/index.md"] = "\n".join(index) + "\n"
    return out
