"""The examples of README.md and docs/, as the tests run them.

A page's fenced blocks are read in order with the HTML comments just above and below each:

    <!-- examples: run -->          (the page: run its bash and python blocks; README.md runs by default)
    <!-- examples: check -->        (the page: compose and check its `python -m fedagg.run` lines; the default)
    <!-- run -->                    (above a block of a `check` page: run this one)
    <!-- tiny: rounds=2 -->         (above a block: appended to each of its `python -m fedagg.run` lines)
    <!-- needs: mnist -->           (above a block: MNIST's files; run alone, skipped with the reason without them)
    <!-- check-only: REASON -->     (above a block: compose and check only, e.g. a download or a long run)
    <!-- skip: REASON -->           (above a block: not run; the test lists the reason)
    <!-- slow: REASON -->           (above a block: run by the slow tests only, `pytest -m slow`)
    <!-- check: prints "TEXT" -->   (below a block: its output holds TEXT)
    <!-- check: exists PATH -->     (below: the file exists afterwards)
    <!-- check: json PATH KEY LOW HIGH -->  or  <!-- check: json PATH KEY VALUE -->
    <!-- check: count "TEXT" N -->  (below: its output holds TEXT exactly N times, e.g. one line a run)

A python or yaml block whose first line is `# some/path.ext` is written to that path first, as a reader would
save it. A path with a placeholder (`outputs/multirun/<date>/<time>`) is the newest folder that matches.
Everything runs in a fresh folder with the repository's python, as on a fresh clone.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```(\w*)\s*$")
_COMMENT = re.compile(r"^<!--\s*([\w-]+)\s*:?\s*(.*?)\s*-->\s*$")
RUN = "python -m fedagg.run"


@dataclass
class Block:
    page: str
    line: int
    lang: str
    code: str
    above: dict[str, str] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)

    @property
    def path(self) -> str | None:
        """The file a reader saves this block as, when its first line names one."""
        first = self.code.splitlines()[0] if self.code else ""
        found = re.match(r"^# ([\w./-]+\.(?:py|yaml))\s*$", first)
        return found.group(1) if found and self.lang in ("python", "yaml") else None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def page_mode(text: str, page: Path) -> str:
    found = re.search(r"^<!--\s*examples:\s*(\w+)\s*-->", text, re.M)
    return found.group(1) if found else ("run" if page.name == "README.md" and page.parent == ROOT else "check")


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        above, j = {}, i - 1
        while j >= 0 and (m := _COMMENT.match(lines[j])):
            above.setdefault(m.group(1), m.group(2))
            j -= 1
        end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
        block = Block(str(page.relative_to(ROOT)), i + 1, fence.group(1), "\n".join(lines[i + 1:end]) + "\n", above)
        k = end + 1
        while k < len(lines) and (m := _COMMENT.match(lines[k])):
            if m.group(1) == "check":
                block.checks.append(m.group(2))
            k += 1
        out.append(block)
        i = end + 1
    return out


def commands(code: str) -> list[str]:
    """The block's shell lines: continuations joined, comments (a whole line, or after two spaces) dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s+)#(\s.*)?$", "", line).strip()
        if line:
            out.append(line)
    return out


def with_tiny(line: str, tiny: str) -> str:
    if not tiny or (RUN not in line and "python -m fedagg.compare" not in line):
        return line
    cut = line.find(" || ")  # `cmd || true`: the overrides go on the command
    return f"{line[:cut]} {tiny}{line[cut:]}" if cut >= 0 else f"{line} {tiny}"


def environment(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    env["WANDB_SILENT"] = "true"
    env.pop("FEDAGG_DATA", None)
    env.update(extra or {})
    return env


def newest(line: str) -> str:
    """A path with a placeholder the reader fills in from what an earlier command wrote (`outputs/multirun/<date>/
    <time>`): the newest folder that matches, as `ls -t` lists it."""
    def found(match: re.Match) -> str:
        pattern = re.sub(r"<[^<>/\s]+>", "*", match.group(0))
        return f'"$(ls -dt {pattern} | head -n 1)"'

    return re.sub(r"[\w./-]*<[^<>/\s]+>[\w./<>-]*", found, line)


def shell(block: Block) -> str:
    lines = [newest(with_tiny(line, block.above.get("tiny", ""))) for line in commands(block.code)]
    # `PYTHONPATH=. python ...`: the reader's folder on the path, beside the fedagg under test
    lines = [line.replace("PYTHONPATH=. ", 'PYTHONPATH=".:$PYTHONPATH" ') for line in lines]
    # `python scripts/x.py`, typed in a clone's root: the repository's script, from the fresh folder
    lines = [re.sub(r"(^|\s)python scripts/", rf"\1python {shlex.quote(str(ROOT))}/scripts/", line) for line in lines]
    lines = [re.sub(r"(^|\s)python(\s)", rf"\1{shlex.quote(sys.executable)}\2", line) for line in lines]
    return "set -e\n" + "\n".join(lines) + "\n"


def execute(block: Block, folder: Path, env: dict, timeout: float = 300) -> str:
    """Run one block in `folder` (a file block is saved there); its output, or AssertionError with it."""
    if block.path:
        target = folder / block.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.code)
        return ""
    if "scripts/" in block.code and not (folder / "scripts").exists():
        (folder / "scripts").symlink_to(ROOT / "scripts")  # the page's commands run from a clone's root
    if block.lang == "python":
        argv = [sys.executable, "-c", block.code]
    elif block.lang in ("bash", "sh", "shell"):
        argv = ["bash", "-c", shell(block)]
    else:
        return ""
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{block.name} exited {done.returncode}:\n{output[-3000:]}"
    return output


def verify(block: Block, folder: Path, output: str) -> None:
    """The claims written below the block."""
    for claim in block.checks:
        kind, _, rest = claim.partition(" ")
        if kind == "prints":
            text = rest.strip().strip('"')
            assert text in output, f"{block.name}: its output lacks {text!r}:\n{output[-3000:]}"
        elif kind == "count":
            text, times = rest.rsplit(" ", 1)
            text = text.strip().strip('"')
            found = output.count(text)
            assert found == int(times), (f"{block.name}: {text!r} {found} times, the page says {times}:\n"
                                         f"{output[-3000:]}")
        elif kind == "exists":
            assert (folder / rest.strip()).exists(), f"{block.name}: {rest.strip()} was not written"
        elif kind == "json":
            parts = shlex.split(rest)
            data = json.loads((folder / parts[0]).read_text())
            value = data[parts[1]]
            if len(parts) == 4:
                assert float(parts[2]) <= value <= float(parts[3]), f"{block.name}: {parts[1]}={value} not in {parts[2:]}"
            else:
                assert str(value) == parts[2], f"{block.name}: {parts[1]}={value!r}, the page says {parts[2]!r}"
        else:
            raise AssertionError(f"{block.name}: unknown check {claim!r}")


def run_lines(block: Block, variables: dict | None = None) -> list[str]:
    """The `python -m fedagg.run` lines of a block, each as the arguments after it; `variables`: the page's shell
    variables so far (C="..." in one block, $C in a later one), updated with this block's."""
    variables = {} if variables is None else variables
    code = block.code
    for name, value in re.findall(r'^([A-Z_][A-Z0-9_]*)="([^"]*)"\s*$', code, re.M | re.S):
        variables[name] = " ".join(value.split())
    code = re.sub(r'^[A-Z_][A-Z0-9_]*="[^"]*"\s*$', "", code, flags=re.M | re.S)
    for name, value in re.findall(r"^([A-Z_][A-Z0-9_]*)=(\S+)\s*$", code, re.M):  # R=aggregator=a,b
        variables[name] = value
    code = re.sub(r"^[A-Z_][A-Z0-9_]*=\S+\s*$", "", code, flags=re.M)
    out = []
    for line in commands(code):
        line = re.sub(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", lambda m: variables.get(m.group(1), m.group(0)), line)
        if RUN in line:
            args = line.split(RUN, 1)[1]
            args = re.sub(r"\s\|\|.*$", "", args)
            out.append(re.sub(r"<([^<>]+)>", lambda m: re.sub(r"\W+", "_", m.group(1)), args).strip())
    return out
