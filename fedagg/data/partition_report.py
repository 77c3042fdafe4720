"""What a client split looks like, saved with every run as `partition.json` and `partition.png`.

Results are files (DESIGN principle 7): the JSON lets tables and plots be rebuilt
without rerunning the split, the picture lets a person see the skew at a glance.
Up to `_BARS_MAX` clients the picture has a bar per client; beyond that (FEMNIST has
3,597 writers) bars are thinner than a pixel and take seconds to draw, so it summarises
them: a histogram of client sizes and a heatmap of each client's label shares. The
picture is drawn in a background thread (importing matplotlib alone takes about a
second), so training starts without waiting for it; `drawn()` waits for it. A sweep's
jobs often split the data alike (the same seed and partition under other methods): a
picture of a split drawn before in this process is copied rather than drawn again.
"""

from __future__ import annotations

import json
import logging
import hashlib
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

_LEGEND_MAX = 20  # beyond this many classes a legend hides the bars it explains
_BARS_MAX = 50  # clients drawn one bar each; more are summarised
log = logging.getLogger(__name__)
_drawing: dict[Path, threading.Thread] = {}  # partition.png being drawn -> its thread
_first: dict[str, tuple[Path, threading.Thread]] = {}  # a split's digest -> its first picture and the thread drawing it


def partition_stats(labels: Tensor, parts: list[Tensor], num_classes: int) -> dict:
    """Per client its size and per-class counts, as plain ints ready for JSON."""
    labels = labels.cpu().long()
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, num_classes={num_classes}), "
                         f"found {int(labels.min())}..{int(labels.max())}")
    clients = [{"id": k, "size": int(idx.numel()),
                "class_counts": torch.bincount(labels[idx.cpu().long()], minlength=num_classes).tolist()}
               for k, idx in enumerate(parts)]
    return {"num_clients": len(parts), "num_classes": num_classes,
            "total": sum(c["size"] for c in clients), "clients": clients}


def save_partition_report(stats: dict, run_dir: str | Path) -> None:
    """Write run_dir/partition.json and run_dir/partition.png, unless a resumed run's folder has them already."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(stats, indent=1)
    json_path, png = run_dir / "partition.json", run_dir / "partition.png"
    if json_path.exists() and png.exists() and json_path.read_text() == text:
        return  # the same split: drawn once
    json_path.write_text(text)
    png.unlink(missing_ok=True)  # an earlier split's picture must not stand for this one
    digest = hashlib.sha256(text.encode()).hexdigest()
    # not a daemon: the interpreter waits for the picture before it exits, however the run ends
    thread = threading.Thread(target=_draw, args=(stats, png, text, _first.get(digest)), name="partition.png")
    _first.setdefault(digest, (png, thread))
    _drawing[png] = thread
    thread.start()


def drawn(path: str | Path | None = None) -> None:
    """Wait until the picture at `path` (every picture being drawn, when None) is on disk."""
    for png, thread in list(_drawing.items()):
        if path is None or png == Path(path):
            thread.join()
            _drawing.pop(png, None)


def _same_split_drawn(text: str, drawn_before: tuple[Path, threading.Thread] | None) -> Path | None:
    """The picture drawn before of the split `text`, while its folder still holds that split."""
    if drawn_before is None:
        return None
    png, thread = drawn_before
    thread.join()
    try:
        same = png.with_name("partition.json").read_text() == text and png.is_file()
    except OSError:
        return None
    return png if same else None


def _draw(stats: dict, path: Path, text: str = "", drawn_before: tuple[Path, threading.Thread] | None = None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        if (source := _same_split_drawn(text, drawn_before)) is not None:
            shutil.copyfile(source, tmp)
        else:  # never drawn, or that picture failed or was removed since
            (_plot if stats["num_clients"] <= _BARS_MAX else _summary)(stats, tmp)
        os.replace(tmp, path)  # readers never see half a picture
    except Exception as err:  # noqa: BLE001 - a picture that fails must not fail the run it illustrates
        tmp.unlink(missing_ok=True)
        log.warning("partition.png was not drawn: %s: %s", type(err).__name__, err)


def _class_colors(num_classes: int) -> list:
    import matplotlib

    if num_classes <= 10:
        return list(matplotlib.colormaps["tab10"].colors)
    if num_classes <= _LEGEND_MAX:
        return list(matplotlib.colormaps["tab20"].colors)
    return list(matplotlib.colormaps["turbo"].resampled(num_classes)(np.arange(num_classes)))


def _plot(stats: dict, path: Path) -> None:
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
    colors = _class_colors(c)
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
    ax.set_title(f"Partition: {k} clients, {stats['total']} samples, {c} classes")
    ax.grid(axis="x", alpha=0.3)
    ax.margins(x=0.02)
    if c <= _LEGEND_MAX:
        ax.legend(handles=[Patch(color=colors[j], label=str(j)) for j in range(c)], title="class", loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    else:
        scale = ScalarMappable(Normalize(-0.5, c - 0.5), matplotlib.colormaps["turbo"].resampled(c))
        fig.colorbar(scale, ax=ax, label="class", fraction=0.03, aspect=40)
    fig.savefig(path, dpi=100, format="png")


def _summary(stats: dict, path: Path) -> None:
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
    top.set_title(f"Partition: {k} clients, {stats['total']} samples, {c} classes "
                  f"(sizes {int(sizes.min())}-{int(sizes.max())}, median {int(np.median(sizes))})")
    image = bottom.imshow(shares, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=1,
                          extent=(-0.5, c - 0.5, k - 0.5, -0.5))  # client 0 at the top, as in partition.json
    bottom.set_xlabel("class")
    bottom.set_ylabel("client")
    fig.colorbar(image, ax=bottom, label="share of the client's samples", fraction=0.03, aspect=40)
    fig.savefig(path, dpi=100, format="png")
