"""partition.png, drawn in a process of its own: `python -P partition_picture.py` reads requests from stdin.

A run's process only sends the request and goes on: importing matplotlib takes about a second, which in a thread
of the run's own process held the interpreter's lock from the run's set-up (the README's default run spent 0.7 s
of its 3.3 s on it). This file imports nothing of fedagg (nor torch), so the drawing process starts in a fraction
of a second; one serves every picture of the process that started it.

A request is one JSON line {"json": partition.json, "png": the picture to write, "copy_from": a picture of the
same split drawn before, or null, "title": the partition it shows (`dirichlet alpha=0.5 of digits`), or null}; the
reply one JSON line {"png": ..., "how": "drawn" | "copied", or "error": ...}, in the order asked. Up to `BARS_MAX` clients the picture has a bar per client; beyond that (FEMNIST has 3,597
writers) bars are thinner than a pixel and take seconds to draw, so it summarises them: a histogram of client
sizes and a heatmap of each client's label shares.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np

LEGEND_MAX = 20  # beyond this many classes a legend hides the bars it explains
BARS_MAX = 50  # clients drawn one bar each; more are summarised


def serve(requests, replies) -> None:
    """Answer each request line of `requests` with a reply line on `replies`, until `requests` ends."""
    for line in requests:
        request = json.loads(line)
        png = Path(request["png"])
        tmp = png.with_name(png.name + ".tmp")
        try:
            how = answer(Path(request["json"]), png, tmp, request.get("copy_from"), request.get("title"))
            os.replace(tmp, png)  # readers never see half a picture
            reply = {"png": str(png), "how": how}
        except Exception as err:  # noqa: BLE001 - a picture that fails must not fail the run it illustrates
            tmp.unlink(missing_ok=True)
            reply = {"png": str(png), "error": f"{type(err).__name__}: {err}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def answer(json_path: Path, png: Path, tmp: Path, copy_from: str | None, title: str | None = None) -> str:
    text = json_path.read_text()
    if copy_from is not None and _stands_beside(Path(copy_from), text):
        shutil.copyfile(copy_from, tmp)
        return "copied"
    draw(json.loads(text), tmp, title)
    return "drawn"


def _stands_beside(png: Path, text: str) -> bool:
    """The picture drawn before still stands beside the split `text` (its folder may hold another split since)."""
    try:
        return png.is_file() and png.with_name("partition.json").read_text() == text
    except OSError:
        return False


def draw(stats: dict, path: Path, title: str | None = None) -> None:
    (plot_bars if stats["num_clients"] <= BARS_MAX else plot_summary)(stats, path, title)


def heading(stats: dict, title: str | None) -> str:
    """`Partition dirichlet alpha=0.5 of digits` over `10 clients, ...`: which split, then its size."""
    return f"Partition{' ' + title if title else ''}\n{stats['num_clients']} clients, {stats['total']} samples, " \
           f"{stats['num_classes']} classes"


def class_colors(num_classes: int) -> list:
    import matplotlib

    if num_classes <= 10:
        return list(matplotlib.colormaps["tab10"].colors)
    if num_classes <= LEGEND_MAX:
        return list(matplotlib.colormaps["tab20"].colors)
    return list(matplotlib.colormaps["turbo"].resampled(num_classes)(np.arange(num_classes)))


def plot_bars(stats: dict, path: Path, title: str | None = None) -> None:
    # imported here: matplotlib takes most of a second to import, and only this picture needs it
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    k, c = stats["num_clients"], stats["num_classes"]
    counts = np.array([cl["class_counts"] for cl in stats["clients"]], dtype=np.int64).reshape(k, c)
    # A Figure on its own Agg canvas, not pyplot: no global backend switch and no figure
    # registry to leak into, so nothing stays open once this function returns.
    # About 0.18 in per client keeps 10 clients compact and 100 readable; the cap stops
    # thousands of clients from making an image no viewer opens.
    fig = Figure(figsize=(9.0, min(1.8 + 0.18 * k, 60.0)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = class_colors(c)
    # a class's bars as one collection of rectangles: barh adds a patch per bar, which took most of the picture's
    # half second (a sweep draws one per split, beside its training)
    y = np.arange(k)[:, None] + np.array([-0.425, 0.425, 0.425, -0.425])  # [k, 4] corners, height 0.85
    right = counts.cumsum(1)
    for j in range(c):
        x = np.stack([right[:, j] - counts[:, j]] * 2 + [right[:, j]] * 2, 1)  # left, left, right, right
        # thin white edges keep neighbouring classes of similar colour apart
        bars = ax.add_collection(PolyCollection(np.stack([x, y], 2), facecolors=[colors[j]], edgecolors="white",
                                                linewidths=0.3))
        bars.sticky_edges.x.append(0)  # as barh's: the x axis starts at 0, the margin only on the right
    ax.set_ylim(k - 0.5, -0.5)  # client 0 at the top, as in partition.json
    step = max(1, -(-k // 50))  # at most ~50 labelled ticks, so ids never overlap
    ax.set_yticks(np.arange(0, k, step))
    ax.tick_params(axis="y", labelsize=8 if k > 20 else 10)
    ax.set_xlabel("samples")
    ax.set_ylabel("client")
    ax.set_title(heading(stats, title))
    ax.grid(axis="x", alpha=0.3)
    ax.margins(x=0.02)
    if c <= LEGEND_MAX:
        ax.legend(handles=[Patch(color=colors[j], label=str(j)) for j in range(c)], title="class", loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    else:
        scale = ScalarMappable(Normalize(-0.5, c - 0.5), matplotlib.colormaps["turbo"].resampled(c))
        fig.colorbar(scale, ax=ax, label="class", fraction=0.03, aspect=40)
    fig.savefig(path, dpi=100, format="png", metadata={"Title": heading(stats, title)})  # the title as text, too


def plot_summary(stats: dict, path: Path, title: str | None = None) -> None:
    """Many clients: how their sizes spread, and each one's label shares as a row of a heatmap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    k, c = stats["num_clients"], stats["num_classes"]
    counts = np.array([cl["class_counts"] for cl in stats["clients"]], dtype=np.float64).reshape(k, c)
    sizes = counts.sum(axis=1)
    shares = counts / np.maximum(sizes, 1)[:, None]
    fig = Figure(figsize=(9.0, 7.0), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, height_ratios=[1, 3])
    top.hist(sizes, bins=min(50, max(10, int(np.sqrt(k)))), color="tab:blue")
    top.set_xlabel("client size (samples)")
    top.set_ylabel("clients")
    top.set_title(f"{heading(stats, title)} "
                  f"(sizes {int(sizes.min())}-{int(sizes.max())}, median {int(np.median(sizes))})")
    image = bottom.imshow(shares, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=1,
                          extent=(-0.5, c - 0.5, k - 0.5, -0.5))  # client 0 at the top, as in partition.json
    bottom.set_xlabel("class")
    bottom.set_ylabel("client")
    fig.colorbar(image, ax=bottom, label="share of the client's samples", fraction=0.03, aspect=40)
    fig.savefig(path, dpi=100, format="png", metadata={"Title": heading(stats, title)})


if __name__ == "__main__":
    # Ctrl-C and SIGTERM reach a terminal's or a scheduler's whole process group: the run stops after its round
    # and still waits for its pictures, so this process ends when its run closes its stdin, not before
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import matplotlib.backends.backend_agg  # noqa: F401  (imported while the run sets up, not at its first picture)
    import matplotlib.collections  # noqa: F401
    import matplotlib.figure  # noqa: F401
    serve(sys.stdin, sys.stdout)
