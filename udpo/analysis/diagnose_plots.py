"""PNG figures for ``udpo diagnose``: one figure per function, numbers from the summary.

Each ``*_figure`` function returns a matplotlib :class:`~matplotlib.figure.Figure` built without pyplot
(no global figure registry, no GUI backend); :func:`figures` yields every figure of a summary and
:func:`write_plots` saves them as PNG.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from udpo.analysis.diagnose_run import UNCERTAINTY_LABELS, Run, safe_name

FAIL_COLOR, SUCCESS_COLOR = "#d62728", "#2ca02c"
METRIC_COLORS = {"u_intra": "#1f77b4", "u_inter": "#ff7f0e", "u_sys": "#9467bd", "dae": "#8c564b"}
#: marker and size per metric, largest first, so curves that coincide stay visible under each other
METRIC_MARKERS = {"u_intra": ("o", 8), "u_inter": ("s", 6), "u_sys": ("^", 5), "dae": ("x", 4)}


def _fmt_p(p: float | None) -> str:
    """'p < 0.001' or 'p = 0.012' ('p = n/a' when undefined)."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "p = n/a"
    return "p < 0.001" if p < 1e-3 else f"p = {p:.3f}"


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def distributions_figure(run: Run, stats: dict[str, Any]) -> Figure:
    """Per metric, the share of failed and of successful debates in each tenth of [0, 1], side by side."""
    fig = Figure(figsize=(4.4 * len(UNCERTAINTY_LABELS), 4.2), layout="constrained")
    axes = fig.subplots(1, len(UNCERTAINTY_LABELS), sharey=True)
    edges = np.linspace(0, 1, 11)
    centers = (edges[:-1] + edges[1:]) / 2
    width = 0.045
    classes = (
        (~run.correct, FAIL_COLOR, "failed", -width / 2),
        (run.correct, SUCCESS_COLOR, "successful", width / 2),
    )
    for ax, (metric, name) in zip(axes, UNCERTAINTY_LABELS.items(), strict=True):
        values = run.values(metric)
        test = stats["failure_vs_success"][metric]
        for sel, color, label, shift in classes:
            if not sel.any():
                ax.text(0.5, 0.9, f"no {label} debates", transform=ax.transAxes, ha="center", color=color)
            else:
                counts, _ = np.histogram(values[sel], bins=edges)
                ax.bar(
                    centers + shift,
                    100 * counts / sel.sum(),
                    width,
                    color=color,
                    edgecolor="black",
                    linewidth=0.4,
                    label=f"{label} debates (n = {int(sel.sum())})",
                )
                ax.axvline(values[sel].mean(), color=color, linestyle="--", linewidth=1.2)
        ax.set_title(f"{name}: {_fmt_p(test['p_value'])}, Cohen's d = {_fmt(test['cohens_d'])}", fontsize=10)
        ax.set_xlabel(f"{name} (0 = certain, 1 = most uncertain)")
        ax.set_xlim(0, 1)
        ax.set_xticks(edges[::2])
        ax.set_ylabel("share of the group's debates (%)")
        ax.tick_params(labelleft=True)  # each panel reads on its own
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="gray", linestyle="--"))
    labels.append("group mean")
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=9)
    fig.suptitle(
        f"{run.label}: uncertainty of failed vs successful debates (Welch t-test, Cohen's d)", fontsize=11
    )
    return fig


def correlation_figure(run: Run, stats: dict[str, Any]) -> Figure:
    """Pearson correlation heatmap of the uncertainty metrics and correctness, r and p in each cell."""
    cm = stats["correlation_matrix"]
    names = [UNCERTAINTY_LABELS.get(v, "Correct") for v in cm["variables"]]
    r = np.array([[np.nan if v is None else v for v in row] for row in cm["r"]], dtype=float)
    fig = Figure(figsize=(6.0, 5.2), layout="constrained")
    ax = fig.subplots()
    cmap = colormaps["RdBu_r"].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(r), cmap=cmap, vmin=-1, vmax=1)
    for i in range(len(names)):
        for j in range(len(names)):
            if math.isnan(r[i, j]):
                text = "n/a\n(constant)"
            else:  # the diagonal's p-value says nothing
                text = f"r = {r[i, j]:.2f}" + ("" if i == j else f"\n{_fmt_p(cm['p_value'][i][j])}")
            dark = not math.isnan(r[i, j]) and abs(r[i, j]) > 0.6
            ax.text(j, i, text, ha="center", va="center", fontsize=9, color="white" if dark else "black")
    ax.set_xticks(range(len(names)), names)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("Correct: 1 = right debate, 0 = wrong", fontsize=9)
    ax.set_ylabel("U_*: 0 = certain, 1 = most uncertain", fontsize=9)
    ax.set_title(f"{run.label}: Pearson correlations (n = {len(run)} debates)", fontsize=11)
    fig.colorbar(image, ax=ax, label="Pearson r", shrink=0.85)
    return fig


def selective_figure(summary: dict[str, Any]) -> Figure:
    """Accuracy of the k% least uncertain debates against k, one panel per run, one line per metric.

    The legend sits below the panels, where it cannot hide a curve.
    """
    runs = summary["runs"]
    cols = min(3, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig = Figure(figsize=(4.8 * cols, 3.6 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    for ax, (label, stats) in zip(axes.flat, runs.items(), strict=False):
        for metric, name in UNCERTAINTY_LABELS.items():
            curve = stats["selective_prediction"][metric]
            ax.plot(
                [c["k"] for c in curve],
                [100 * c["accuracy"] for c in curve],
                marker=METRIC_MARKERS[metric][0],
                markersize=METRIC_MARKERS[metric][1],
                color=METRIC_COLORS[metric],
                label=f"rank by {name}",
            )
        ax.axhline(100 * stats["accuracy"], color="gray", linestyle="--", linewidth=1, label="all debates")
        ax.set_title(f"{label} (n = {stats['n_debates']})", fontsize=10)
        ax.set_xlabel("debates kept, lowest uncertainty first (%)")
        ax.set_ylabel("accuracy of kept debates (%)")
        ax.set_xticks(range(10, 101, 10))
        ax.set_ylim(-2, 102)
        ax.tick_params(labelleft=True)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(runs) :]:
        fig.delaxes(ax)
    fig.legend(
        *fig.axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2 * cols, fontsize=9
    )
    fig.suptitle("Selective prediction: keep the k% least uncertain debates", fontsize=11)
    return fig


def gains_figure(summary: dict[str, Any]) -> Figure:
    """Grouped bars: accuracy gain (points) over the baseline per bin of the baseline's U_sys; a bin no
    question falls in says so once; with many runs the bar values are written upright."""
    gains = summary["stratified_gains"]
    methods = [m for m, g in gains.items() if g["bins"]]
    fig = Figure(figsize=(8.8, 4.2), layout="constrained")
    ax = fig.subplots()
    if not methods:
        ax.text(0.5, 0.5, "no questions shared with the baseline run", ha="center", va="center")
        ax.set_axis_off()
    else:
        bins = gains[methods[0]]["bins"]
        x = np.arange(len(bins))
        width = 0.8 / len(methods)
        upright = len(methods) > 4  # side by side, narrow bars' values would overlap
        for k, method in enumerate(methods):
            rows = gains[method]["bins"]
            heights = [np.nan if b["gain"] is None else 100 * b["gain"] for b in rows]
            bars = ax.bar(
                x + (k - (len(methods) - 1) / 2) * width,
                np.nan_to_num(heights),
                width,
                label=method,
                edgecolor="black",
                linewidth=0.5,
            )
            for bar, h in zip(bars, heights, strict=True):
                if math.isnan(h):
                    continue
                ax.annotate(
                    f"{h:+.0f}",
                    (bar.get_x() + bar.get_width() / 2, h),
                    ha="center",
                    va="bottom" if h >= 0 else "top",
                    rotation=90 if upright else 0,
                    fontsize=8,
                    xytext=(0, 2 if h >= 0 else -2),
                    textcoords="offset points",
                )
        counts = [b["n_questions"] for b in bins]
        for i in np.flatnonzero(np.array(counts) == 0):
            ax.annotate(
                "no questions",
                (x[i], 0),
                ha="center",
                va="bottom",
                fontsize=8,
                color="dimgray",
                xytext=(0, 2),
                textcoords="offset points",
            )
        ax.set_xticks(x, [f"{b['bin']}\nn = {n}" for b, n in zip(bins, counts, strict=True)])
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xlabel(f"U_sys of the baseline run '{summary['baseline']}' (question difficulty)")
        ax.set_ylabel("accuracy gain over baseline (points)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(title="run", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the bars
        ymin, ymax = ax.get_ylim()
        pad = 0.12 * (ymax - ymin)
        ax.set_ylim(ymin - pad, ymax + pad)
    ax.set_title(f"Accuracy gain over '{summary['baseline']}' by difficulty", fontsize=11)
    return fig


def figures(runs: list[Run], summary: dict[str, Any]) -> Iterator[tuple[str, Figure]]:
    """Every figure of a summary with its file stem, one at a time (see :func:`udpo.analysis.diagnose.summarize`)."""
    for run in runs:
        stats = summary["runs"][run.label]
        name = safe_name(run.label)
        yield f"distributions_{name}", distributions_figure(run, stats)
        yield f"correlation_{name}", correlation_figure(run, stats)
    yield "selective_prediction", selective_figure(summary)
    if summary.get("stratified_gains"):
        yield "stratified_gains", gains_figure(summary)


def write_plots(out: Path, runs: list[Run], summary: dict[str, Any]) -> list[Path]:
    """Save every figure of a summary as ``out/<stem>.png``; returns the paths written."""
    written = []
    for stem, fig in figures(runs, summary):
        fig.savefig(out / f"{stem}.png", dpi=110)
        written.append(out / f"{stem}.png")
    return written
