"""The GPU path's targets beside what ``scripts/gpu_check.sh`` measured, in one table.

    python benchmarks/gpu_targets.py --figures DIR [--report DIR] [--failed PARTS] [--left PARTS --rerun CMD]

Reads the figures the check's steps wrote to ``--figures`` (each file optional: a missing one is a row
that says "not measured", so a check cut short still reports what it finished):

- ``decode_135m.json``, ``decode_1b.json``: ``benchmarks/decode.py --json``;
- ``iteration_1b_n3.json``, ``iteration_1b_n10.json``, ``iteration_7b_n3.json``: ``benchmarks/iteration.py --json``;
- ``update_1b.json``: ``benchmarks/train_step.py --only update --json``;
- ``study.json``: ``benchmarks/study_plan.py --json``;
- ``update_profile_1b_n3.json``: ``benchmarks/iteration.py --profile-update``, the 1B N = 3 run's update once
  more under ``torch.profiler`` (``benchmarks/profiling.py``): one line of where its time went;
- ``iteration_1b_n3.torch.log``: the 1B N = 3 run's ``TORCH_LOGS=recompiles,graph_breaks`` output
  (``TORCH_LOGS_OUT``), whose recompiles and graph breaks are counted (and a recompile limit dynamo hit
  named: past it calls run uncompiled).

The memory targets are what a user needs of the defaults on an 80 GB card: each of the 1B N = 3, 1B N = 10
and 7B N = 3 runs trains every iteration asked without running out of memory; the update's peak stays
within the plan autosize printed (what the process held before training, the decode buffers the rollouts
keep and the estimated activations) with 10% to spare; each study worker's peak stays within its share of the card.

Prints the table (markdown): each target's measured value, the goal and whether it was met ("-" where a row
is reported without a goal); ``--failed`` names the check's parts that failed, in the title; ``--left``
the parts the budget left out, under the table, with ``--rerun``, the command that runs them. ``--report
DIR`` also writes it to ``DIR/summary.md`` and every file read, merged, to ``DIR/figures.json``: two small
files to keep from a machine that is given back.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: decode.py's name of the anchor: transformers' generate with a static cache, compiled on a GPU
ANCHOR = "generate(static)"
#: the targets on one 80 GB card
DECODE_RATIO = 0.7  # the project's rollout, 3 adapters, at least this share of the anchor's tokens/s
ITERATION_S = 3.0  # the 1B shape's N = 3 iteration, under this many seconds
PLAN_MARGIN = 1.1  # the update's peak within the plan autosize printed, this much to spare
#: the runs whose defaults must not run out of memory: figures file -> what it trains
RUNS = {"iteration_1b_n3": "1B shape, N = 3", "iteration_1b_n10": "1B shape, N = 10",
        "iteration_7b_n3": "7B shape, N = 3"}  # fmt: skip


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
    """Each decode path measured (auto: the CUDA graph on a GPU; graph_static; stacked; eager) against the
    anchor, with the most adapters measured and with none, and its first call's seconds (a compiled
    path's compile); the goal is the auto path's, with adapters."""
    what = f"rollout tokens/s, {shape} shape, {{}} / {ANCHOR} compiled, no adapters"
    results = (record or {}).get("results", [])
    anchor = next((r for r in results if r["path"] == ANCHOR), None)
    ours = [r for r in results if r["path"] != ANCHOR]
    if anchor is None or not ours:
        return [Row(what.format("3 adapters"), NOT_MEASURED, f">= {DECODE_RATIO}x")]
    rows = []
    for r in sorted(ours, key=lambda r: (-r["adapters"], not r["path"].startswith("auto"))):
        ratio = r["tokens_per_s"] / anchor["tokens_per_s"]
        label = f"{r['path']}, {r['adapters']} adapters" if r["adapters"] else f"{r['path']}, no adapters"
        measured = f"{ratio:.2f}x ({r['tokens_per_s']:,.0f} / {anchor['tokens_per_s']:,.0f})"
        if "first_call" in r:
            measured += f"; first call {r['first_call']:.1f} s"
        if r["adapters"] and r["path"].startswith("auto"):
            rows.append(Row(what.format(label), measured, f">= {DECODE_RATIO}x", ratio >= DECODE_RATIO))
        else:
            rows.append(Row(what.format(label), measured))
    return rows


def peak(record: dict | None) -> float | None:
    """The most GPU memory any of the run's iterations held (the first one's too), GiB."""
    peaks = [it["peak_gib"] for it in (record or {}).get("iterations", []) if "peak_gib" in it]
    return max(peaks) if peaks else None


def iteration_rows(n3: dict | None) -> list[Row]:
    """The median iteration after the first against its target, and the first (where the decode step
    compiles) beside it."""
    after = (n3 or {}).get("after_first")
    iterations = (n3 or {}).get("iterations", [])
    first = f"; first iteration {iterations[0]['iteration']:.1f} s" if iterations else ""
    return [
        target_row(
            "1B shape, N = 3 iteration (median after the first)",
            f"< {ITERATION_S} s",
            None if after is None else after["iteration"],
            lambda s: f"{s:.2f} s (rollout {after['rollout']:.2f}, update {after['update']:.2f}){first}",
            lambda s: s < ITERATION_S,
        )
    ]


def profile_row(record: dict | None) -> Row:
    """The 1B N = 3 update profiled once: the device's busy time against the wall time (the rest: launches,
    Python, host syncs), the operator with the most device time (CPU time without a device), each kind
    of step's host / device seconds (the agents' summed) and the log-prob passes."""
    what = "1B N = 3 update, profiled (once more, on the last iteration's debates)"
    if not record:
        return Row(what, NOT_MEASURED)
    if "error" in record:
        return Row(what, f"failed: {record['error'][:150]}")
    wall, busy = record["wall_s"], record.get("device_busy_s")
    if busy is None:
        head = f"wall {wall:.2f} s on {record['device']}, no device activity recorded"
    else:
        syncs = record["syncs"]
        head = (
            f"device busy {busy:.2f} s of {wall:.2f} s wall ({100 * record['idle_share']:.0f}% idle; "
            f"un-profiled {record['unprofiled_update_s']:.2f} s); {record['launches']:,} kernel launches, "
            f"{syncs['count']:,} host syncs ({syncs['seconds']:.2f} s)"
        )
    parts = [head]
    if record.get("top_ops"):
        top = record["top_ops"][0]
        seconds = top["self_cpu_s"] if top["self_device_s"] is None else top["self_device_s"]
        parts.append(f"top op {top['name']} {seconds:.2f} s (x{top['count']:,})")
    steps: dict[str, list[float]] = {}
    for name, p in record.get("phases", {}).items():
        step = re.sub(r"^update/|/agent_\d+$", "", name)
        host_device = steps.setdefault(step, [0.0, 0.0])
        host_device[0] += p["host_s"]
        host_device[1] += p["device_s"]
    if steps:
        shown = sorted(steps.items(), key=lambda kv: -max(kv[1]))[:6]
        parts.append("host / device s: " + ", ".join(f"{k} {h:.2f} / {d:.2f}" for k, (h, d) in shown))
    forward = record.get("forward")
    if forward:
        limits = (
            f" (at most {forward['rows_per_pass']} rows / {forward['positions_per_pass']:,} positions each)"
            if "rows_per_pass" in forward
            else ""
        )
        packed = (
            f", {forward['rows']:,} rows for {forward['completions']:,} completions (rounds sharing a row)"
            if forward.get("completions")
            else ""
        )
        parts.append(
            f"{forward['passes']} log-prob passes{limits}, {forward['positions']:,} positions "
            f"({100 * forward['padding']:.0f}% padding){packed}"
        )
    return Row(what, "; ".join(parts))


def recompile_row(log: str | None) -> Row:
    """The 1B N = 3 run's recompiles and graph breaks, as ``TORCH_LOGS=recompiles,graph_breaks`` logged
    them, with the most frequent reason for a recompile."""
    what = "1B shape, N = 3 run: dynamo recompiles / graph breaks (TORCH_LOGS)"
    if log is None:
        return Row(what, NOT_MEASURED)
    recompiles = log.count("Recompiling function")
    breaks = len(re.findall(r"Graph break", log))
    reasons = re.findall(
        r"triggered by the following guard failure\(s\):\s*\n\s*-\s*(?:\d+/\d+:\s*)?(.+)", log
    )
    common = max(set(reasons), key=reasons.count)[:100] if reasons else None
    measured = f"{recompiles} recompiles, {breaks} graph breaks" + (f" (most: {common})" if common else "")
    limits = sorted(set(re.findall(r"torch._dynamo hit config\.(\w+)", log)))
    if limits:  # past it dynamo runs the function uncompiled
        measured += f"; {', '.join(limits)} hit: some calls ran uncompiled"
    return Row(what, measured)


def memory_rows(found: dict[str, dict]) -> list[Row]:
    """Per run of :data:`RUNS`: every iteration asked for done without an error (out of memory among
    them), and the update's peak within the printed plan (+10%)."""
    rows = []
    for name, what in RUNS.items():
        record = found.get(name)
        goal = "all iterations, no out-of-memory"
        if record is None:
            rows.append(Row(f"{what}: trains with the default sizes", NOT_MEASURED, goal))
            continue
        done, asked = len(record.get("iterations", [])), record.get("iterations_asked", 0)
        error, p = record.get("error"), peak(record)
        measured = f"{done} of {asked} iterations" + (f", peak {p:.1f} GiB" if p is not None else "")
        measured += f"; {error[:120]}" if error else ""
        finished = done >= asked > 0 and not error
        rows.append(Row(f"{what}: trains with the default sizes", measured, goal, finished))
        update_peaks = [
            it["update_peak_gib"] for it in record.get("iterations", []) if "update_peak_gib" in it
        ]
        if "plan_activations_gib" in record and update_peaks:
            planned = (
                record["plan_held_gib"] + record.get("plan_kept_gib", 0) + record["plan_activations_gib"]
            )
            most = max(update_peaks)
            rows.append(
                Row(
                    f"{what}: update peak / the plan autosize printed (held + decode buffers + estimated activations)",
                    f"{most / planned:.2f}x ({most:.1f} / {planned:.1f} GiB; "
                    f"{record['plan_free_gib']:.1f} GiB free at planning)",
                    f"<= {PLAN_MARGIN}x",
                    most <= PLAN_MARGIN * planned,
                )
            )
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


def study_rows(record: dict | None) -> list[Row]:
    what = "the proof study plan, shortened (runs x iterations, workers sharing the GPU): wall time"
    if record is None:
        return [Row(what, NOT_MEASURED)]
    failed = f"; FAILED: {record['error'].strip().splitlines()[-1][:150]}" if record.get("error") else ""
    rows = [
        Row(
            what,
            f"{record['wall_s']:.0f} s ({record['runs']} runs x {record['iterations']}, {record['workers']} workers)"
            + failed,
        )
    ]
    peaks, share = record.get("peaks_gib") or {}, record.get("share_gib")
    if peaks and share:
        most = max(peaks.values())
        rows.append(
            Row(
                "study workers: the largest run's peak / its share of the card",
                f"{most / share:.2f}x ({most:.1f} / {share:.1f} GiB)",
                "<= 1.0x",
                most <= share,
            )
        )
    return rows


def table(found: dict[str, dict], torch_log: str | None = None) -> list[Row]:
    return [
        *decode_rows("1B", found.get("decode_1b")),
        *iteration_rows(found.get("iteration_1b_n3")),
        profile_row(found.get("update_profile_1b_n3")),
        recompile_row(torch_log),
        *decode_rows("135M", found.get("decode_135m")),
        *study_rows(found.get("study")),
        *memory_rows(found),
        update_row(found.get("update_1b")),
    ]


def render(
    rows: list[Row],
    device: str,
    failed: list[str] | None = None,
    left: list[str] | None = None,
    rerun: str = "",
) -> str:
    """The table under a title naming the device and, where some failed, the check's failed parts; under
    it, the parts left out and the command that runs them."""
    title = f"GPU targets on {device}" + (
        f"; parts that FAILED (see the log): {', '.join(failed)}" if failed else ""
    )
    lines = [title, "", "| what | measured | target | met |", "|---|---|---|---|"]
    tail = (
        [f"\nParts left out (the budget): {', '.join(left)}. Run them with:\n\n    {rerun}"] if left else []
    )
    return "\n".join([*lines, *(r.cells() for r in rows), *tail]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--figures", required=True, help="the folder the check's steps wrote their JSON to")
    parser.add_argument("--report", help="also write summary.md and figures.json here")
    parser.add_argument("--failed", default="", help="the check's parts that failed, separated by spaces")
    parser.add_argument("--left", default="", help="the parts the budget left out, separated by spaces")
    parser.add_argument("--rerun", default="", help="the command that runs the parts left out")
    args = parser.parse_args()
    figures = Path(args.figures)
    found = load(figures)
    log_path = figures / "iteration_1b_n3.torch.log"
    torch_log = log_path.read_text(errors="replace") if log_path.exists() else None
    device = next(
        (r["device"] for r in found.values() if isinstance(r.get("device"), str)), "an unnamed device"
    )
    text = render(table(found, torch_log), device, args.failed.split(), args.left.split(), args.rerun)
    print(text, end="")
    if args.report:
        report = Path(args.report)
        report.mkdir(parents=True, exist_ok=True)
        for name, content in (("summary.md", text), ("figures.json", json.dumps(found, indent=1))):
            tmp = report / f".{name}.tmp"  # renamed into place: a reader, or a kill, never meets half a file
            tmp.write_text(content)
            tmp.replace(report / name)


if __name__ == "__main__":
    main()
