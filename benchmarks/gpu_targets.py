"""The GPU path's targets (issue 42) beside what ``scripts/gpu_check.sh`` measured, in one table.

    python benchmarks/gpu_targets.py --figures DIR [--report DIR]

Reads the figures the check's steps wrote to ``--figures`` (each file optional: a missing one is a row
that says "not measured", so a check cut short still reports what it finished):

- ``decode_135m.json``, ``decode_1b.json``: ``benchmarks/decode.py --json``;
- ``iteration_1b_n3.json``, ``iteration_1b_n10.json``, ``iteration_7b_n3.json``: ``benchmarks/iteration.py --json``;
- ``update_1b.json``: ``benchmarks/train_step.py --only update --json``;
- ``study.json``: ``benchmarks/study_plan.py --json``.

Prints the table (markdown): each target's measured value, the goal and whether it was met ("-" where a row
is reported without a goal); ``--failed`` names the check's parts that failed, in the title. ``--report
DIR`` also writes it to ``DIR/summary.md`` and every file read, merged, to ``DIR/figures.json``: two small
files to keep from a machine that is given back.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: decode.py's name of the anchor: transformers' generate with a static cache, compiled on a GPU
ANCHOR = "generate(static)"
#: the targets on one 80 GB card (issue 42)
DECODE_RATIO = 0.7  # the project's rollout, 3 adapters, at least this share of the anchor's tokens/s
ITERATION_S = 3.0  # the 1B shape's N = 3 iteration, under this many seconds
PEAK_GIB = 6.0  # the 1B shape's N = 3 peak GPU memory, under this
PEAK_GROWTH = 1.2  # the 1B shape's N = 10 peak within this factor of N = 3's


@dataclass
class Row:
    what: str
    measured: str
    goal: str = "-"
    met: bool | None = None  # None: reported without a goal, or not measured

    def cells(self) -> str:
        met = "-" if self.met is None else ("yes" if self.met else "**no**")
        return f"| {self.what} | {self.measured} | {self.goal} | {met} |"


NOT_MEASURED = "not measured"


def load(figures: Path) -> dict[str, dict]:
    """Every ``*.json`` in ``figures``, by file stem (a file that does not parse is left out, with a note)."""
    found = {}
    for path in sorted(figures.glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            print(f"gpu_targets: {path} left out ({err})")
    return found


def target_row(
    what: str, goal: str, value: float | None, show: Callable[[float], str], met: Callable[[float], bool]
) -> Row:
    """A target's row: "not measured" where ``value`` is None, else ``show(value)`` and ``met(value)``."""
    return Row(what, NOT_MEASURED, goal) if value is None else Row(what, show(value), goal, met(value))


def decode_rows(shape: str, record: dict | None) -> list[Row]:
    """The project's rollout (the auto path: the CUDA graph on a GPU) against the anchor, with the most
    adapters measured and with none."""
    what = f"rollout tokens/s, {shape} shape, {{}} / {ANCHOR} compiled, no adapters"
    results = (record or {}).get("results", [])
    anchor = next((r for r in results if r["path"] == ANCHOR), None)
    ours = [r for r in results if r["path"].startswith("auto")]
    if anchor is None or not ours:
        return [Row(what.format("3 adapters"), NOT_MEASURED, f">= {DECODE_RATIO}x")]
    rows = []
    for r in sorted(ours, key=lambda r: -r["adapters"]):
        ratio = r["tokens_per_s"] / anchor["tokens_per_s"]
        label = f"{r['path']}, {r['adapters']} adapters" if r["adapters"] else f"{r['path']}, no adapters"
        measured = f"{ratio:.2f}x ({r['tokens_per_s']:,.0f} / {anchor['tokens_per_s']:,.0f})"
        if r["adapters"]:
            rows.append(Row(what.format(label), measured, f">= {DECODE_RATIO}x", ratio >= DECODE_RATIO))
        else:
            rows.append(Row(what.format(label), measured))
    return rows


def peak(record: dict | None) -> float | None:
    """The most GPU memory any of the run's iterations held (the first one's too), GiB."""
    peaks = [it["peak_gib"] for it in (record or {}).get("iterations", []) if "peak_gib" in it]
    return max(peaks) if peaks else None


def iteration_rows(n3: dict | None, n10: dict | None, shape7b: dict | None) -> list[Row]:
    after = (n3 or {}).get("after_first")
    p3, p10 = peak(n3), peak(n10)
    rows = [
        target_row(
            "1B shape, N = 3 iteration (median after the first)",
            f"< {ITERATION_S} s",
            None if after is None else after["iteration"],
            lambda s: f"{s:.2f} s (rollout {after['rollout']:.2f}, update {after['update']:.2f})",
            lambda s: s < ITERATION_S,
        ),
        target_row(
            "1B shape, N = 3 peak GPU memory (any iteration)",
            f"< {PEAK_GIB} GiB",
            p3,
            lambda gib: f"{gib:.2f} GiB",
            lambda gib: gib < PEAK_GIB,
        ),
        target_row(
            "1B shape, N = 10 peak / N = 3 peak",
            f"<= {PEAK_GROWTH}x",
            None if p3 is None or p10 is None else p10 / p3,
            lambda growth: f"{growth:.2f}x ({p10:.2f} GiB)",
            lambda growth: growth <= PEAK_GROWTH,
        ),
    ]
    if n10 and n10.get("after_first"):
        rows.append(
            Row(
                "1B shape, N = 10 iteration (median after the first)",
                f"{n10['after_first']['iteration']:.2f} s",
            )
        )
    what = "7B shape, N = 3 trains (default sizes)"
    if shape7b is None:
        rows.append(Row(what, NOT_MEASURED, "trains"))
    else:
        done, p7 = len(shape7b["iterations"]), peak(shape7b)
        seconds = shape7b["iterations"][-1]["iteration"] if done else 0.0
        measured = f"{done} iterations, last {seconds:.1f} s" + (
            f", peak {p7:.1f} GiB" if p7 is not None else ""
        )
        rows.append(Row(what, measured, "trains", done > 0))
    return rows


def update_row(record: dict | None) -> Row:
    what = "1B shape: the update / a bare PEFT forward + backward over the same packed rows"
    update = (record or {}).get("update", {})
    if "after_vs_bare_packed" not in update:
        return Row(what, NOT_MEASURED)
    return Row(
        what,
        f"{update['after_vs_bare_packed']:.2f}x ({update['after_s']:.2f} s / {update['bare_packed_s']:.2f} s)",
    )


def study_row(record: dict | None) -> Row:
    what = "the proof study plan, shortened (runs x iterations, workers sharing the GPU): wall time"
    if record is None:
        return Row(what, NOT_MEASURED)
    return Row(
        what,
        f"{record['wall_s']:.0f} s ({record['runs']} runs x {record['iterations']}, {record['workers']} workers)",
    )


def table(found: dict[str, dict]) -> list[Row]:
    return [
        *decode_rows("135M", found.get("decode_135m")),
        *decode_rows("1B", found.get("decode_1b")),
        *iteration_rows(
            found.get("iteration_1b_n3"), found.get("iteration_1b_n10"), found.get("iteration_7b_n3")
        ),
        update_row(found.get("update_1b")),
        study_row(found.get("study")),
    ]


def render(rows: list[Row], device: str, failed: list[str] | None = None) -> str:
    """The table under a title naming the device and, where some failed, the check's failed parts."""
    title = f"GPU targets on {device}" + (
        f"; parts that FAILED (see the log): {', '.join(failed)}" if failed else ""
    )
    lines = [title, "", "| what | measured | target | met |", "|---|---|---|---|"]
    return "\n".join([*lines, *(r.cells() for r in rows)]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--figures", required=True, help="the folder the check's steps wrote their JSON to")
    parser.add_argument("--report", help="also write summary.md and figures.json here")
    parser.add_argument("--failed", default="", help="the check's parts that failed, separated by spaces")
    args = parser.parse_args()
    found = load(Path(args.figures))
    device = next(
        (r["device"] for r in found.values() if isinstance(r.get("device"), str)), "an unnamed device"
    )
    text = render(table(found), device, args.failed.split())
    print(text, end="")
    if args.report:
        report = Path(args.report)
        report.mkdir(parents=True, exist_ok=True)
        (report / "summary.md").write_text(text)
        (report / "figures.json").write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
