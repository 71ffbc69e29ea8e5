"""The seeds' changes over Standard MAD as a picture (``seed_changes.png`` of ``udpo compare``).

One panel per metric, one row per trained method: a dot for each seed's change (after - before, its mean
over the test questions), the mean of the seeds' changes, the t-interval over seeds (thick bar) and the
bootstrap over seeds and problems (thin bar with caps) of :func:`udpo.study.intervals.seed_change`. The line at
zero is "no change": the pre-registered reading (``docs/lab/preregistration.md``) asks whether both bars lie
on one side of it.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

#: metrics where a higher value is better; every other one the tables analyse (the uncertainties, the
#: consensus-on-wrong guard, unparsed answers, agents that collapsed) is better lower
HIGHER_IS_BETTER = ("accuracy",)


def seed_change_figure(changes: dict[str, dict[str, dict[str, Any]]]) -> Figure:
    """``changes``: method -> metric -> a ``SeedChange.to_dict()`` (every method the same metrics, in the
    order the panels take)."""
    methods = list(changes)
    if not methods:
        raise ValueError("no method to plot")
    metrics = list(changes[methods[0]])
    ncols = min(3, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig = Figure(figsize=(3.4 * ncols + 1.2, (0.5 * len(methods) + 1.4) * nrows + 0.4), layout="constrained")
    grid = fig.subplots(nrows, ncols, sharey=True, squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    for ax, metric in zip(axes, metrics, strict=False):
        for y, method in enumerate(methods):
            c = changes[method][metric]
            if c["t_low"] is not None:
                ax.plot(
                    [c["t_low"], c["t_high"]], [y, y], color="C0", alpha=0.55, lw=6, solid_capstyle="butt"
                )
            ax.plot([c["boot_low"], c["boot_high"]], [y, y], "|-", color="0.15", lw=1.1, ms=8)
            ax.plot(c["per_seed"], [y + 0.25] * len(c["per_seed"]), "o", color="C1", ms=3.5, alpha=0.7)
            ax.plot([c["delta"]], [y], "D", color="black", ms=5)
        ax.axvline(0.0, color="0.3", lw=0.8, ls="--")
        better = "higher is better" if metric in HIGHER_IS_BETTER else "lower is better"
        ax.set_title(f"{metric}\n({better})", fontsize=9)
        ax.set_xlabel("change over Standard MAD", fontsize=8)
        ax.tick_params(labelsize=8)
    axes[0].set_yticks(range(len(methods)), methods)
    axes[0].set_ylim(len(methods) - 0.4, -0.6)  # first method on top, its seeds' dots just below it
    fig.suptitle(
        "per seed (dots), mean (diamond), t-interval over seeds (thick bar), bootstrap seeds x problems (thin, capped)",
        fontsize=9,
    )
    return fig
