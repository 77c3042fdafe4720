"""`python -m fedagg.results COMMAND FOLDER ...`: the one command line of the results layer.

    table   a sweep's table (next to a paper's numbers; --baseline: paired statistics), table.md and table.csv
    stats   only the paired statistics against --baseline: differences with 95% intervals, ranks, Friedman, CD
    plot    accuracy, update-norm and aggregation-weight curves (PNGs)
    report  one self-contained HTML page of a sweep

`python -m fedagg.results COMMAND --help` lists each command's options.
"""

from __future__ import annotations

import sys

COMMANDS = {"table": "fedagg.results.table", "stats": "fedagg.results.table", "plot": "fedagg.results.plots",
            "report": "fedagg.results.report"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        given = f"{argv[0]!r} is not a command; " if argv and argv[0] not in ("-h", "--help") else ""
        print(f"{given}usage: python -m fedagg.results {{{','.join(COMMANDS)}}} FOLDER ... (--help after a command "
              "lists its options)", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    import importlib

    module = importlib.import_module(COMMANDS[argv[0]])
    if argv[0] == "stats":
        return module.main(argv[1:], prog="python -m fedagg.results stats", stats_only=True)
    return module.main(argv[1:], prog=f"python -m fedagg.results {argv[0]}")


if __name__ == "__main__":
    sys.exit(main())
