"""The overview part of a report, rendered as static HTML: per run its debate sets' accuracy and
uncertainty, a training run's curves (``metrics.jsonl``), calibration and settings, an attack run's
table, a collection's index (a ``udpo compare`` folder's table first). Every text from a file goes
through :func:`html.escape`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from udpo.env.answer_forms import forms_used

from .load import DebateSet, Run
from .svg import line_plot

#: the settings of a training run shown in its overview (the whole config is one click away)
CONFIG_KEYS = (
    "task",
    "model",
    "algorithm",
    "n_agents",
    "rounds",
    "max_tokens",
    "max_iterations",
    "questions_per_iteration",
    "debates_per_question",
    "dynamic_sampling",
    "learning_rate",
    "eval_questions",
    "eval_steps",
    "seed",
)
KIND_NAMES = {
    "debate": "debate run",
    "evaluation": "evaluation folder",
    "training": "training run",
    "attack": "attack evaluation (udpo eval)",
    "collection": "collection of runs",
}
#: ``udpo compare``'s table: results.json's metric keys -> column names, and the method changes are over
COMPARE_METRICS = {
    "accuracy": "accuracy",
    "u_intra": "U_intra",
    "u_inter": "U_inter",
    "u_sys": "U_sys",
    "wrong_majority": "wrong majority",
    "wrong_unanimous": "wrong unanimous",
    "unparsed_rate": "unparsed",
}
BASELINE = "standard_mad"
#: the calibration record's block of the ordering report (udpo.rewards.ordering)
ORDERING = "ordering"
#: the calibration record's block of the correctness floor (udpo.rewards.correctness_floor)
FLOOR = "correctness_floor"
#: the correctness floor's per-agent rows: record key -> row label
FLOOR_ROWS = {
    "lambda_star": "lambda* (the split wins above it)",
    "lambda_before": "lambda before the floor",
    "lambda_after": "lambda after the floor",
}
_AGENT_KEY = re.compile(r"^agent_(\d+)/(.+)$")


def number(x: Any, digits: int = 3) -> str:
    """A number for a table cell; an en dash when missing or not finite."""
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float) and math.isfinite(x):
        return f"{x:.{digits}f}"
    return "–" if x is None or isinstance(x, float) else escape(str(x))


def anchor(label: str) -> str:
    """An id for a run's section."""
    return "run-" + re.sub(r"[^A-Za-z0-9_-]+", "-", label).strip("-")


def run_overview(run: Run, tag: str = "") -> str:
    """One run's overview section (a collection's children get theirs below its index)."""
    head = f"{escape(tag)} {escape(run.label)}".strip()
    parts = [
        f'<div class="run" id="{anchor(tag + run.label)}">',
        f'<h3>{head} <span class="kind">{escape(KIND_NAMES.get(run.kind, run.kind))}</span></h3>',
        f'<p class="path">{escape(str(run.path))}</p>',
    ]
    if run.kind == "collection":
        if run.results is not None:
            parts.append(compare_table(run.results))
            parts.append(seed_change_table(run.results))
        elif run.done:
            parts.append(compare_progress(run.done))
        parts.append(collection_index(run, tag))
        parts.extend(f'<p class="warn">skipped: {escape(note)}</p>' for note in run.skipped)
    else:
        parts.append(sets_table(run.sets))
        parts.append(forms_table(run.sets))
    if run.attack is not None:
        parts.append(attack_table(run.attack))
    if run.kind in ("debate", "evaluation") and run.sets and run.sets[0].common_meta:
        parts.append(meta_list(run.sets[0].common_meta))
    if run.kind == "training":
        parts.append(training_section(run))
    for child in run.children:
        parts.append(run_overview(child, tag))
    parts.append("</div>")
    return "".join(parts)


def sets_table(sets: Sequence[DebateSet]) -> str:
    """Debates, accuracy, mean U_intra / U_inter / U_sys, the unparsed rate and the consensus-on-wrong guard
    (shares of debates ending with a majority, or every agent, on a wrong answer) of each debate set."""
    rows = "".join(
        f"<tr><td>{escape(s.name)}</td><td>{s.stats['n']}</td><td>{number(s.stats['accuracy'])}</td>"
        f"<td>{number(s.stats['u_intra'])}</td><td>{number(s.stats['u_inter'])}</td>"
        f"<td>{number(s.stats['u_sys'])}</td><td>{number(s.stats['unparsed_rate'])}</td>"
        f"<td>{number(s.stats.get('wrong_majority'))}</td><td>{number(s.stats.get('wrong_unanimous'))}</td></tr>"
        for s in sets
    )
    return (
        '<table class="stats"><thead><tr><th>debates</th><th>n</th><th>accuracy</th><th>U_intra</th>'
        f"<th>U_inter</th><th>U_sys</th><th>unparsed rate</th><th>wrong majority</th><th>wrong unanimous</th>"
        f"</tr></thead><tbody>{rows}</tbody></table>"
    )


def forms_table(sets: Sequence[DebateSet]) -> str:
    """Per debate set and agent: its turns, its echo rate (turns refused for restating the question) and
    the forms its answers were read in (docs/metrics.md, "Answer forms and echo rate"); empty without turns."""
    rows = "".join(
        f"<tr><td>{escape(s.name)}</td><td>{escape(agent)}</td><td>{f['turns']}</td>"
        f"<td>{number(f['echo_rate'])}</td><td>{escape(forms_used(f))}</td></tr>"
        for s in sets
        for agent, f in s.forms.items()
        if f["turns"]
    )
    if not rows:
        return ""
    return (
        '<table class="stats"><caption>Answer forms per agent</caption><thead><tr><th>debates</th>'
        "<th>agent</th><th>turns</th><th>echo rate</th><th>forms</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def meta_list(meta: dict[str, Any]) -> str:
    """The settings every debate of a set shares, as a definition list."""
    items = "".join(f"<dt>{escape(str(k))}</dt><dd>{escape(str(v))}</dd>" for k, v in meta.items())
    return f'<dl class="meta">{items}</dl>'


def collection_index(run: Run, tag: str) -> str:
    """Links to each sub-run's overview, with its size and primary set's accuracy."""
    items = []
    for child in run.children:
        primary = child.sets[child.primary] if child.sets else None
        acc = f" · accuracy {number(primary.stats['accuracy'])} on {primary.stats['n']}" if primary else ""
        items.append(
            f'<li><a href="#{anchor(tag + child.label)}">{escape(child.label)}</a> '
            f"({escape(KIND_NAMES.get(child.kind, child.kind))}{acc})</li>"
        )
    return f'<ul class="index">{"".join(items)}</ul>'


def three(x: Any, sign: str = "") -> str:
    """A number to three decimals, as ``udpo compare``'s table.md (``sign="+"``: signed); an en dash when
    it is not a finite number."""
    usable = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
    return f"{x:{sign}.3f}" if usable else "–"


def bounds(low: Any, high: Any, sign: str = "") -> str:
    """``[low, high]`` (en dashes for what is missing, e.g. the t-interval of one seed)."""
    return f"[{three(low, sign)}, {three(high, sign)}]"


def interval(mean: Any, low: Any, high: Any, sign: str = "") -> str:
    """``mean [low, high]`` to three decimals, as ``udpo compare``'s table.md (``sign="+"``: signed)."""
    return "–" if three(mean) == "–" else f"{three(mean, sign)} {bounds(low, high, sign)}"


def compare_table(results: dict[str, Any]) -> str:
    """``udpo compare``'s table as its results.json holds it: per method each metric's mean over seeds
    with its 95% interval (each seed's questions resampled), and accuracy's change over Standard MAD with
    its paired interval, or, where the seeds share their problems, without one: its intervals are the seed
    analysis's (:func:`seed_change_table`; one resampling questions alone would treat the seeds x questions
    cells as independent)."""
    rows = []
    for method, entry in results["methods"].items():
        entry = entry if isinstance(entry, dict) else {}
        stats = {m: e if isinstance(e := entry.get(m), dict) else {} for m in COMPARE_METRICS}
        cells = "".join(
            f"<td>{interval(e.get('mean'), e.get('low'), e.get('high'))}</td>" for e in stats.values()
        )
        acc = stats["accuracy"]
        if method == BASELINE:
            change = "–"
        elif isinstance(acc.get("seed_change"), dict):
            change = f"{three(acc.get('change'), '+')} (intervals: seed table)"
        else:
            change = interval(acc.get("change"), acc.get("change_low"), acc.get("change_high"), "+")
        rows.append(
            f"<tr><td>{escape(str(method))}</td>{cells}<td>{change}</td>"
            f"<td>{number(entry.get('n_questions'))}</td></tr>"
        )
    seeds = ", ".join(str(s) for s in results.get("seeds") or [])
    head = "".join(f"<th>{name}</th>" for name in COMPARE_METRICS.values())
    return (
        f'<table class="stats compare"><caption>udpo compare (results.json): mean over seeds {escape(seeds)} '
        f"[95% interval, each seed's questions resampled]</caption><thead><tr><th>method</th>{head}<th>accuracy change vs Standard MAD</th>"
        f"<th>questions</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def seed_change_table(results: dict[str, Any]) -> str:
    """The pre-registered analysis of ``udpo compare`` (``seed_change`` in results.json, present when every
    seed evaluated the same problems): per trained method and metric the mean of the seeds' changes over
    Standard MAD, the t-interval over seeds, the bootstrap over seeds and problems, and each seed's
    change. Empty when no entry has it."""
    rows = []
    for method, entry in results["methods"].items():
        if method == BASELINE or not isinstance(entry, dict):
            continue
        for metric, name in COMPARE_METRICS.items():
            c = entry.get(metric).get("seed_change") if isinstance(entry.get(metric), dict) else None
            if not isinstance(c, dict):
                continue
            per_seed = c.get("per_seed") if isinstance(c.get("per_seed"), list) else []
            rows.append(
                f"<tr><td>{escape(str(method))}</td><td>{name}</td><td>{three(c.get('delta'), '+')}</td>"
                f"<td>{bounds(c.get('t_low'), c.get('t_high'), '+')}</td>"
                f"<td>{bounds(c.get('boot_low'), c.get('boot_high'), '+')}</td>"
                f"<td>{', '.join(three(v, '+') for v in per_seed)}</td></tr>"
            )
    if not rows:
        return ""
    return (
        '<table class="stats seed-change"><caption>change over Standard MAD, seeds sharing their problems '
        "(results.json seed_change): mean of the seeds' changes, 95% t-interval over seeds, 95% bootstrap "
        "over seeds and problems</caption><thead><tr><th>method</th><th>metric</th><th>change</th>"
        "<th>t-interval over seeds</th><th>bootstrap seeds x problems</th><th>change per seed</th></tr>"
        f"</thead><tbody>{''.join(rows)}</tbody></table>"
    )


def compare_progress(done: dict[str, bool]) -> str:
    """One line for a compare folder without results.json yet: which of its runs are done."""
    finished = [escape(k) for k, v in done.items() if v]
    waiting = [escape(k) for k, v in done.items() if not v]
    return (
        f'<p class="warn">No results.json yet (udpo compare writes its table once every run is done): '
        f"{len(finished)} of {len(done)} runs done{' (' + ', '.join(finished) + ')' if finished else ''}"
        f"{'; not done yet: ' + ', '.join(waiting) if waiting else ''}.</p>"
    )


def attack_table(summary: dict[str, Any]) -> str:
    """An attack run's rows: compromised agents, accuracy and uncertainties, change from natural."""
    keys = ("accuracy", "u_intra", "u_inter", "u_sys", "wrong_majority", "wrong_unanimous")
    rows = []
    for r in summary.get("rows", []):
        if not isinstance(r, dict):
            continue
        delta = r.get("delta") or {}
        compromised = ", ".join(str(i) for i in r.get("compromised") or []) or "none"
        cells = "".join(f"<td>{number(r.get(k))}</td>" for k in keys)
        deltas = "".join(f"<td>{number(delta.get(k)) if isinstance(delta, dict) else '–'}</td>" for k in keys)
        rows.append(
            f"<tr><td>{escape(str(r.get('name')))}</td><td>{escape(compromised)}</td>{cells}{deltas}</tr>"
        )
    attack = summary.get("attack")
    title = escape(json.dumps(attack, ensure_ascii=False) if not isinstance(attack, str) else attack)
    head = "".join(f"<th>{k}</th>" for k in keys) + "".join(f"<th>Δ {k}</th>" for k in keys)
    return (
        f'<p class="attack">attack: <code>{title}</code></p><table class="stats"><thead><tr><th>row</th>'
        f"<th>compromised agents</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def training_section(run: Run) -> str:
    """A training run's settings, curves and calibration."""
    parts = []
    if run.config:
        shown = {k: run.config[k] for k in CONFIG_KEYS if k in run.config}
        parts.append(meta_list(shown))
        full = escape(json.dumps(run.config, indent=2, ensure_ascii=False, default=str))
        parts.append(f"<details><summary>full config.json</summary><pre>{full}</pre></details>")
    plots = training_plots(run.metrics)
    if plots:
        parts.append(f'<div class="plots">{"".join(plots)}</div>')
    else:
        parts.append("<p>No iterations in metrics.jsonl yet.</p>")
    if run.calibration:
        parts.append("<h4>Calibration (calibration.json)</h4>")
        parts.append(calibration_tables(run.calibration))
    return "".join(parts)


def _series(records: Iterable[dict[str, Any]], key: str) -> list[tuple[float, float | None]]:
    out = []
    for r in records:
        if key in r and isinstance(r.get("iteration"), int | float):
            v = r[key]
            out.append((float(r["iteration"]), float(v) if isinstance(v, int | float) else None))
    return out


def _agent_keys(records: Sequence[dict[str, Any]], metric: str) -> list[str]:
    """``agent_i/<metric>`` keys present in any record, by agent number."""
    found = {k for r in records for k in r if (m := _AGENT_KEY.match(k)) and m.group(2) == metric}
    return sorted(found, key=lambda k: int(k.split("/")[0].split("_")[1]))


def _form_keys(records: Sequence[dict[str, Any]], prefix: str) -> list[str]:
    """``<prefix>agent_i/echo_rate`` keys present in any record, by agent number."""
    found = {k for r in records for k in r if k.startswith(prefix + "agent_") and k.endswith("/echo_rate")}
    return sorted(found, key=lambda k: int(k[len(prefix) :].split("/")[0].split("_")[1]))


def training_plots(metrics: Sequence[dict[str, Any]]) -> list[str]:
    """SVG plots of metrics.jsonl: reward terms, KL, clip fraction, loss, training debates, and the
    held-out evaluations' accuracy (with eval callbacks' accuracies) and uncertainty."""
    train = [r for r in metrics if r.get("kind") == "train"]
    evals = [r for r in metrics if r.get("kind") == "eval"]
    callback_acc = sorted(
        {k for r in evals for k in r if k.endswith("/accuracy") or k.endswith("/accuracy_drop")}
    )
    specs: list[tuple[str, Sequence[dict[str, Any]], list[str]]] = [
        ("Held-out accuracy", evals, ["accuracy", *callback_acc]),
        ("Held-out uncertainty", evals, ["u_intra", "u_inter", "u_sys", "unparsed_rate"]),
        ("Consensus on a wrong answer", evals, ["wrong_majority", "wrong_unanimous"]),
        ("Held-out echo rate per agent", evals, _form_keys(evals, "forms/")),
        ("Training echo rate per agent", train, _form_keys(train, "train/forms/")),
        (
            "Reward terms",
            train,
            ["reward/r_intra", "reward/r_inter", "reward/r_sys", "reward/r_task", "reward/mean"],
        ),
        (
            "Informative groups",
            train,
            ["groups/informative", "groups/dropped", "groups/extra_draws", "groups/zero_advantage_agents"],
        ),
        (
            "Reward terms' shares of the within-question differences",
            train,
            sorted({k for r in train for k in r if k.startswith("reward_share/")}),
        ),
        ("KL to the reference", train, ["update/kl", *_agent_keys(train, "kl")]),
        ("Clip fraction", train, ["update/clip_frac", *_agent_keys(train, "clip_frac")]),
        ("Loss", train, ["update/loss", "update/surrogate"]),
        (
            "Training debates",
            train,
            ["train/accuracy", "train/u_intra", "train/u_inter", "train/u_sys", "train/unparsed_rate"],
        ),
    ]
    plots = []
    for title, records, keys in specs:
        series = {k: s for k in keys if (s := _series(records, k))}
        svg = line_plot(series, title) if series else ""
        if svg:
            plots.append(svg)
    return plots


def calibration_tables(calibration: dict[str, Any]) -> str:
    """Per-agent tables for the coefficient and profile blocks, the ordering report's table
    (:func:`ordering_table`), the correctness floor's (:func:`floor_table`), key/value tables for the rest."""
    parts = []
    for block, value in calibration.items():
        own = {ORDERING: ordering_table, FLOOR: floor_table}.get(block)
        if own is not None and (table := own(value)):
            parts.append(table)
        elif isinstance(value, dict) and value and all(_numbers(v) for v in value.values()):
            parts.append(per_agent_table(str(block), value))
        elif isinstance(value, dict):
            flat = _flatten(value)
            rows = "".join(f"<tr><th>{escape(k)}</th><td>{number(v)}</td></tr>" for k, v in flat.items())
            parts.append(
                f'<table class="stats calib"><caption>{escape(str(block))}</caption><tbody>{rows}</tbody></table>'
            )
        elif isinstance(value, list) and value:
            parts.append(f"<p><b>{escape(str(block))}</b>: {escape(', '.join(map(str, value)))}</p>")
    return f'<div class="calibration">{"".join(parts)}</div>'


def per_agent_table(caption: str, rows: dict[str, list]) -> str:
    """A table of one row per entry of ``rows`` (label -> one number per agent), a column per agent."""
    head = "".join(f"<th>agent {i}</th>" for i in range(max(len(v) for v in rows.values())))
    body = "".join(
        f"<tr><th>{escape(str(k))}</th>{''.join(f'<td>{number(x)}</td>' for x in v)}</tr>"
        for k, v in rows.items()
    )
    return (
        f'<table class="stats calib"><caption>{escape(caption)}</caption><thead><tr><th></th>{head}'
        f"</tr></thead><tbody>{body}</tbody></table>"
    )


def floor_table(floor: Any) -> str:
    """The correctness floor (``correctness_floor``, :func:`udpo.rewards.correctness_floor`): per agent the
    threshold lambda* and lambda before and after the floor, the margin in the caption. Empty when the block
    is not such a record."""
    if not (
        isinstance(floor, dict)
        and isinstance(floor.get("margin"), int | float)
        and all(_numbers(floor.get(key)) for key in FLOOR_ROWS)
    ):
        return ""
    caption = f"correctness floor: lambda raised to (1 + {number(floor['margin'])}) lambda* where lower"
    return per_agent_table(caption, {label: floor[key] for key, label in FLOOR_ROWS.items()})


def ordering_table(ordering: Any) -> str:
    """The calibration's ordering report (``ordering``, :mod:`udpo.rewards.ordering`): each agent's reward for
    the reference debates and whether the correct split out-earns the unanimous wrong debate, with a warning
    when it does not for some agent. Empty when the block is not such a report."""
    rewards = ordering.get("reward") if isinstance(ordering, dict) else None
    flags = ordering.get("split_beats_unanimous_wrong") if isinstance(ordering, dict) else None
    if not (
        isinstance(rewards, dict)
        and rewards
        and all(map(_numbers, rewards.values()))
        and isinstance(flags, list)
    ):
        return ""
    head = "".join(f"<th>agent {i}</th>" for i in range(len(flags)))
    rows = [
        f"<tr><th>{escape(str(name).replace('_', ' '))}</th>{''.join(f'<td>{number(x)}</td>' for x in v)}</tr>"
        for name, v in rewards.items()
    ]
    verdicts = "".join(f"<td>{'yes' if f else '<b>no</b>'}</td>" for f in flags)
    rows.append(f"<tr><th>correct split out-earns unanimous wrong</th>{verdicts}</tr>")
    caption = (
        f"reward of reference debates (T = {escape(str(ordering.get('rounds')))}, "
        f"scope {escape(str(ordering.get('scope')))})"
    )
    table = (
        f'<table class="stats calib ordering"><caption>{caption}</caption><thead><tr><th></th>{head}</tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table>"
    )
    losers = [str(i) for i, f in enumerate(flags) if not f]
    if losers:
        table += (
            f'<p class="warn">A debate unanimous on a wrong answer earns agent(s) {", ".join(losers)} at least '
            f"as much as a correct but split one: these coefficients can pay for agreeing on a wrong answer.</p>"
        )
    return table


def _numbers(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, int | float) for x in v)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{name}."))
        elif isinstance(v, list):
            out[name] = ", ".join(number(x) if isinstance(x, float) else str(x) for x in v)
        else:
            out[name] = v
    return out
