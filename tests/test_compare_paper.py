"""What a comparison gives a paper, on folders real `python -m fedagg.compare` runs wrote: table.tex with a caption in
words, significance marks and a width that fits; methods.pdf with TrueType fonts at a column's width, saying what it
shows; one colour and one order per method in every figure; the report's settings; the library's phase columns."""

from __future__ import annotations

import csv
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.colors import to_hex
import pytest

from conftest import ROOT
from results_runs import fake_run

pytest.importorskip("optuna")

ORDER = ("fedprox", "fedavg")  # methods= not in alphabetical order: figures and tables must follow it, not the folders
NAMES = {"fedprox": "FedProx", "fedavg": "FedAvg"}


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> tuple[Path, str]:
    where = tmp_path_factory.mktemp("paper")
    proc = run("-m", "fedagg.compare", f"methods=[{','.join(ORDER)}]", "budget=2", "confirm_seeds=2", "rounds=3",
               "num_clients=6", "hydra.sweep.dir=c", cwd=where)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return where / "c", proc.stderr + proc.stdout


def rows_of(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def figures_of(call, *args, **kwargs) -> list:
    """The matplotlib figures a call draws (captured as it closes them) and what it returned."""
    drawn, close = [], plt.close

    def keep(fig=None):
        drawn.append(fig)
        close(fig)

    plt.close = keep
    try:
        result = call(*args, **kwargs)
    finally:
        plt.close = close
    return [f for f in drawn if f is not None], result


# --- table.tex ---------------------------------------------------------------------------------------------------

def test_table_tex_caption_says_the_setting_the_metric_window_and_the_protocol(compared):
    folder, _ = compared
    tex = (folder / "table.tex").read_text()
    caption = re.search(r"\\caption\{(.*)\}\n", tex)[1]
    for words in (r"Digits (8$\times$8)", r"Dirichlet partition ($\alpha$ = 0.5)", "6 clients, all in every round",
                  "3 rounds", "averaged over the last k = 1 evaluated round of 3", "2 confirm seeds",
                  "budget of 2 trials on tuning seed 0", r"validation share of 10\% of every client's data",
                  "confirmed on the test set on seeds 1, 2", r"95\% interval (paired t)", "* the interval excludes 0",
                  "paired difference to FedProx"):
        assert words in caption, words
    body = tex.split("\n\\midrule\n")[1]
    assert body.index("FedProx &") < body.index("FedAvg &")  # methods= order, not the folders'


def signs_sweep(folder: Path, fedprox: list[float]) -> Path:
    for i, (method, values) in enumerate((("fedavg", [0.90, 0.92]), ("fedprox", fedprox))):
        for seed, acc in enumerate(values):
            fake_run(folder / f"{i}{seed}", acc=acc, seed=seed, choices={"aggregator": method})
    return folder


@pytest.mark.parametrize("fedprox, marked", [([0.93, 0.95], True), ([0.91, 0.95], False)])
def test_a_difference_whose_interval_excludes_zero_is_marked_in_the_tex(tmp_path, fedprox, marked):
    """+3 and +3 points over two seeds: the interval is [3, 3], it excludes 0; +1 and +3: a paired t interval of
    2 ± 12.7 × 1 includes it. The .tex marks the first as the markdown does, not the second."""
    from fedagg.results.table import build_table

    table = build_table(signs_sweep(tmp_path / "s", fedprox), baseline="fedavg")
    row = next(line for line in table.to_latex().splitlines() if line.startswith("fedprox &"))
    cell = table.cells.set_index("method").loc["fedprox"]
    assert bool(cell["excludes_zero"]) is marked and bool(cell["ci_low"] > 0) is marked
    assert ("+3.00* [+3.00, +3.00]" in row) if marked else ("+2.00 [" in row and "*" not in row)
    assert ("*" in table.to_markdown().split("Paired difference")[1].split("fedprox")[1].splitlines()[0]) is marked


def test_the_tex_fits_a_column_or_the_page_and_refuses_another_width(compared, capsys):
    from fedagg.results.table import build_table, main as table_main

    folder, _ = compared
    table = build_table(folder)
    column, page = table.to_latex("column"), table.to_latex("page")
    # Method, then per tuned/defaults the value and Δ: five columns; set in a box, shrunk only when wider
    for tex, env, width in ((column, "table", r"\columnwidth"), (page, "table*", r"\textwidth")):
        assert tex.count(rf"\begin{{{env}}}[t]") == 1 and tex.count(rf"\end{{{env}}}") == 1
        assert r"\sbox0{\begin{tabular}{lrrrr}" in tex
        assert rf"\ifdim\wd0>{width}\resizebox{{{width}}}{{!}}{{\usebox0}}\else\usebox0\fi" in tex
        assert r"Method & Acc. (\%) & $\Delta$ [95\% CI] & Acc. (\%) & $\Delta$ [95\% CI] \\" in tex
    assert (folder / "table.tex").read_text() == column  # what the comparison writes: one column
    with pytest.raises(ValueError, match=r"^width='wide' is not allowed; it must be one of column, page$"):
        table.to_latex("wide")
    assert table_main([str(folder), "--format", "latex", "--width", "page"]) == 0
    assert capsys.readouterr().out == page


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed (texlive-latex-base)")
@pytest.mark.parametrize("options", ["", "twocolumn"])
def test_the_tex_compiles_in_an_article_without_an_overfull_box(compared, tmp_path, options):
    folder, _ = compared
    shutil.copy(folder / "table.tex", tmp_path / "table.tex")
    (tmp_path / "doc.tex").write_text(rf"\documentclass[{options}]{{article}}" "\n"
                                      r"\usepackage{booktabs}\usepackage{graphicx}" "\n"
                                      r"\begin{document}\input{table.tex}Text.\end{document}" "\n")
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    log = (tmp_path / "doc.log").read_text(errors="replace")
    assert proc.returncode == 0, log[-2000:]
    assert "Overfull \\hbox" not in log and (tmp_path / "doc.pdf").stat().st_size > 1000


def test_time_to_target_tex_names_its_target_and_unit(tmp_path):
    from fedagg.results.table import build_table

    sweep = tmp_path / "clock"
    for i, (method, seconds) in enumerate((("fedasync", [30.0, 40.0]), ("fedbuff", [50.0, None]))):
        for seed, t in enumerate(seconds):
            fake_run(sweep / f"{i}{seed}", seed=seed, acc=0.6, best=0.55 if t is None else 0.6,
                     choices={"aggregator": method, "server": "async", "clock": "lognormal"},
                     config={"num_clients": 6, "server": {"concurrency": 3}}, target_acc=0.5, time_to_target=t)
    tex = build_table(sweep, metric="time_to_target").to_latex()
    assert r"Method & Time to 50\% (s) \\" in tex
    caption = re.search(r"\\caption\{(.*)\}\n", tex)[1]
    assert caption.startswith("Digits (8$\\times$8), 6 clients, 3 server steps, asynchronous server (3 clients in "
                              "flight), lognormal clock. Simulated seconds to reach a test accuracy of 50\\%")
    assert r"fedasync & \textbf{35 $\pm$ 7} \\" in tex and r"fedbuff & 50 (1/2 reached) \\" in tex


# --- figures ------------------------------------------------------------------------------------------------------

def test_methods_pdf_embeds_truetype_at_a_column_or_page_width(compared, tmp_path):
    from fedagg.results.figure import comparison_figure

    folder, _ = compared
    for width, inches in (("column", 3.3), ("page", 7.0)):
        out = tmp_path / width
        out.mkdir()
        pdf = comparison_figure(folder, out, width)[0].read_bytes()
        assert b"/FontType 3" not in pdf and b"/Type3" not in pdf  # Type 3: what venue checkers refuse
        assert b"/CIDFontType2" in pdf or b"/TrueType" in pdf
        box = [float(v) for v in re.search(rb"/MediaBox \[\s*([\d.\s]+)\]", pdf)[1].split()]
        assert box[2] == pytest.approx(72 * inches)  # PostScript points
    assert (folder / "methods.pdf").read_bytes()[:4] == b"%PDF"
    if shutil.which("pdffonts"):
        fonts = subprocess.run(["pdffonts", str(folder / "methods.pdf")], capture_output=True, text=True).stdout
        assert "TrueType" in fonts and "Type 3" not in fonts


def test_methods_figure_says_tuned_shades_the_table_window_and_keeps_methods_order(compared):
    from fedagg.results.figure import comparison_figure

    folder, _ = compared
    (fig,), _ = figures_of(comparison_figure, folder, folder)
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert legend.get_title().get_text() == "tuned; mean ± sd over 2 seeds"
    lines = {line.get_label(): line.get_color() for line in ax.get_lines()}
    assert list(lines) == ["FedProx", "FedAvg"] and list(lines.values()) == ["C0", "C1"]
    spans = [p for p in ax.patches if p.get_label().startswith("table: last")]
    assert len(spans) == 1 and spans[0].get_label() == "table: last 1 evaluated round"
    span = spans[0]
    assert (span.get_x(), span.get_x() + span.get_width()) == (2.5, 3.5)  # k = ⌈3/10⌉ = 1: round 3 alone, as the table averages


def test_every_figure_of_a_folder_gives_a_method_one_colour_in_methods_order(compared, tmp_path):
    from fedagg.compare.report import read_selection, tuning_curves
    from fedagg.compare.protocol import make_protocol
    from fedagg.results import plots
    from fedagg.results.comparison import read_protocol

    folder, _ = compared
    figs, _ = figures_of(plots.main, [str(folder), "--out", str(tmp_path), "--wandb-mode", "disabled"])
    protocol = make_protocol(**read_protocol(folder / "protocol.json")["protocol"])
    more, _ = figures_of(tuning_curves, read_selection(folder), protocol, tmp_path / "t.png",
                         {m: NAMES[m] for m in ORDER})
    seen = {}
    for fig in figs + more:
        for ax in fig.axes:
            for line in ax.get_lines():
                if line.get_label() in NAMES.values():
                    seen.setdefault(line.get_label(), set()).add(to_hex(line.get_color()))
    assert len(figs) >= 4 and seen == {"FedProx": {to_hex("C0")}, "FedAvg": {to_hex("C1")}}


# --- report -------------------------------------------------------------------------------------------------------

def test_the_report_shows_objective_settings_and_no_nan_and_no_flat_weight_panels(compared):
    from fedagg.results import report

    folder, _ = compared
    figs, _ = figures_of(report.main, [str(folder), "--wandb-mode", "disabled", "--baseline", "FedAvg"])
    page = re.sub(r'src="data:[^"]*"', "", (folder / "results_report.html").read_text())  # the text, not images
    assert "nan" not in page
    settings = re.search(r"<tr><td>FedProx</td><td><code>FedAvg, objective FedProx</code></td><td>(.*?)</td></tr>", page)
    assert settings and "objective.mu" in settings[1] and "0.01" in settings[1]  # FedProx's default μ among them
    assert "<tr><td>FedAvg</td><td><code>FedAvg</code></td><td>weighting=&quot;samples&quot;</td></tr>" in page
    table = page.split("<h2>Table</h2>")[1]  # methods= order, though the baseline asked for is FedAvg
    assert table.index("<td>FedProx</td>") < table.index("<td>FedAvg</td>")
    # the defaults' rate, from their config, where the runs did not override it: among the varying values, or the
    # one every run shares when the chosen trial is the defaults' own (the first trial)
    lr = re.search(r"<tr><td><code>(?:config\.)?client.lr</code></td><td>(.*?)</td></tr>", page)[1].split(", ")
    assert "0.05" in lr
    weights = page.split("<h2>Aggregation weights</h2>")[1].split("</section>")[0]
    assert "<img" not in weights and "FedAvg, FedProx: each client weighted by its share" in weights
    ticks = [t.get_text() for fig in figs for ax in fig.axes for t in ax.get_yticklabels()
             if "difference to" in ax.get_xlabel()]
    assert ticks and all(t.split(" · ")[0] in NAMES.values() for t in ticks)
    assert not any(key in t.split(" · ") for t in ticks for key in ORDER) and "FedProx" in ticks[0]


# --- library and console ------------------------------------------------------------------------------------------

def test_runs_carry_their_phase_and_each_trial_its_validation_score(compared):
    from fedagg.results import load_curves, load_sweep, load_trials

    folder, log = compared
    assert "no checkpoint yet" not in log  # a fresh comparison: nothing to resume, nothing to say
    frame = load_sweep(folder).set_index("run")
    assert frame.loc["confirm/default/fedavg/s1", ["phase", "tuning"]].tolist() == ["confirm", "defaults"]
    assert frame.loc["confirm/tuned/fedprox/s2", ["phase", "tuning"]].tolist() == ["confirm", "tuned"]
    trials = load_trials(folder)
    assert list(trials["method"]) == ["fedprox", "fedprox", "fedavg", "fedavg"] and list(trials["trial"]) == [0, 1] * 2
    for t in trials.itertuples():
        run_name = f"tune/{t.method}/t{t.trial:03d}/s0"
        assert frame.loc[run_name, "phase"] == "tune" and frame.loc[run_name, "trial"] == t.trial
        val = [float(r["val_acc"]) for r in rows_of(folder / run_name / "metrics.csv") if r["val_acc"]]
        assert t.val_score == pytest.approx(val[-math.ceil(3 / 10):][0])  # one tuning seed, k = 1: its last one
        assert frame.loc[run_name, "val_score"] == pytest.approx(t.val_score)
        assert frame.loc[run_name, "chosen"] == t.chosen
    assert sum(trials["chosen"]) == 2 and "client.lr" in trials and "client.objective.mu" in trials
    curves = load_curves(folder)
    assert set(curves.loc[curves["method"] == "fedprox", "method_name"]) == {"FedProx"}
    assert {"phase", "trial", "tuning", "val_score"} <= set(curves.columns)


def test_results_help_states_the_default_metric_and_what_stats_does(capsys):
    from fedagg.results.table import main as table_main

    for argv, stats_only in ((["--help"], False), (["--help"], True)):
        with pytest.raises(SystemExit):
            table_main(argv, prog="x", stats_only=stats_only)
    table_help, stats_help = capsys.readouterr().out.split("usage: x", 2)[1:]
    assert "else last_k_test_acc: the mean test accuracy of the last k" in " ".join(table_help.split())
    assert "else final_test_acc" not in " ".join(table_help.split())
    assert " ".join(stats_help.split()).split("positional")[0].count("Only the paired statistics of a sweep") == 1
    assert "Print a paper's table" not in stats_help


@pytest.mark.slow  # an asynchronous comparison of 10 runs, 15-30 s
def test_an_asynchronous_comparison_reports_its_time_to_target(tmp_path):
    import json
    import statistics

    from fedagg.results import report

    proc = run("-m", "fedagg.compare", "methods=[fedbuff,fedasync]", "budget=1", "confirm_seeds=2", "rounds=6",
               "num_clients=6", "server=async", "server.concurrency=3", "clock=lognormal", "target_acc=0.5",
               "hydra.sweep.dir=a", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "a"
    page = (folder / "report.html").read_text()
    section = page.split("<h2>Time to the target accuracy</h2>")[1].split("</section>")[0]
    tex = (folder / "table_time.tex").read_text()
    assert r"Method & Time to 50\% (s) & $\Delta$ [95\% CI] & Time to 50\% (s) & $\Delta$ [95\% CI] \\" in tex
    for m, name in (("fedbuff", "FedBuff"), ("fedasync", "FedAsync")):
        times = [json.loads((folder / "confirm" / "tuned" / m / f"s{s}" / "summary.json").read_text())["time_to_target"]
                 for s in (1, 2)]
        reached = [t for t in times if t is not None]
        row = next(line for line in tex.splitlines() if line.startswith(name + " &"))
        if reached:  # the table's mean over the seeds that reached it, as the runs' summaries have it
            assert f"{statistics.fmean(reached):.0f}" in row.split("&")[1]
        else:
            assert "N/A" in row.split("&")[1]
        assert f"<td>{name}</td>" in section
    figs, _ = figures_of(report.main, [str(folder), "--wandb-mode", "disabled"])
    titles = [ax.get_title() for fig in figs for ax in fig.axes]
    assert any(t.endswith(": mean over seeds at each server step") for t in titles)
