"""The report page: static overview HTML, the debates as one JSON blob, and the browsing script.

The page stands alone (file: URL, no network): its style and script are inlined from
``report.css`` and ``report.js`` beside this module, plots are inline SVG. The debates travel in a
``<script type="application/json">`` element that the script parses once and renders a page of
debates at a time; model text is only ever set with ``textContent``. The JSON escapes ``<``, ``>``
and ``&`` so no text can close its element, and the page's Content-Security-Policy allows only its
own script (by hash) and no network at all.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from datetime import datetime, timezone
from html import escape
from importlib.resources import files
from typing import Any

from .load import Run
from .overview import run_overview

#: characters the JSON blob writes as \\uXXXX escapes, so it cannot end its <script> element
_SCRIPT_SAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026"}


def static(name: str) -> str:
    """A file shipped beside this module (report.css, report.js)."""
    return files("udpo.analysis.report").joinpath(name).read_text(encoding="utf-8")


def script_json(data: Any) -> str:
    """JSON for a ``<script type="application/json">`` element: no NaN, and nothing HTML can see."""
    return json.dumps(_finite(data), ensure_ascii=False, separators=(",", ":"), allow_nan=False).translate(
        _SCRIPT_SAFE
    )


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def page_data(runs: list[Run]) -> dict[str, Any]:
    """What the script needs: every debate set (name, shared meta, debates), the set browsed first
    and the pair compared first (None with fewer than two sets)."""
    sets, starts = [], []
    tags = ["A", "B"] if len(runs) == 2 else [""]
    for tag, run in zip(tags, runs, strict=False):
        starts.append(len(sets))
        for s in run.sets:
            name = s.name if s.name == run.label or not tag else f"{run.label}: {s.name}"
            sets.append(
                {
                    "name": f"{tag} · {name}" if tag else name,
                    "meta": {k: v for k, v in s.common_meta.items() if k != "compromised"},
                    "debates": s.debates,
                }
            )
    first = runs[0]
    browse = starts[0] + first.primary
    compare: list[int] | None = None
    if len(runs) == 2 and runs[1].sets:
        compare = [browse, starts[1] + runs[1].primary]
    elif len(sets) >= 2:
        evals = [i for i, s in enumerate(first.sets) if s.name.startswith("eval/iter_")]
        compare = [evals[0], evals[-1]] if len(evals) >= 2 else [0, 1]
    return {"sets": sets, "browse": browse, "compare": compare}


def render_page(runs: list[Run]) -> str:
    """The whole HTML document for one run, or two side by side."""
    css, js = static("report.css"), static("report.js")
    script_hash = base64.b64encode(hashlib.sha256(js.encode("utf-8")).digest()).decode()
    policy = (
        f"default-src 'none'; script-src 'sha256-{script_hash}'; style-src 'unsafe-inline'; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )
    tags = ["A", "B"] if len(runs) == 2 else [""]
    overviews = "".join(run_overview(run, tag) for tag, run in zip(tags, runs, strict=False))
    title = " vs ".join(r.label for r in runs)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    n_debates = sum(len(s.debates) for r in runs for s in r.sets)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{policy}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>udpo report: {escape(title)}</title>
<style>{css}</style>
</head>
<body>
<header>
<h1>udpo report <span class="title">{escape(title)}</span></h1>
<p class="sub">{n_debates} debates · written {when} by <code>udpo report</code> ·
<a href="#overview">overview</a> · <span id="nav-compare" hidden><a href="#compare">side by side</a> · </span><a href="#browse">debates</a></p>
</header>
<noscript><p class="warn">The debates need JavaScript; the overview does not.</p></noscript>
<section id="overview">
<h2>Overview</h2>
<div class="runs{" two" if len(runs) == 2 else ""}">{overviews}</div>
</section>
<section id="compare" hidden>
<h2>Side by side</h2>
<p class="help">Debates of two sets matched by question id; the questions whose outcome changed come first.</p>
<div class="controls">
<label>A <select id="cmp-a"></select></label>
<label>B <select id="cmp-b"></select></label>
<span class="group"><button type="button" id="cmp-changed-first" aria-pressed="true">changed first</button><button type="button" id="cmp-changed-only" aria-pressed="false">changed only</button></span>
</div>
<p id="cmp-summary" class="count"></p>
<div id="cmp-list" class="list"></div>
<div class="pager"><button type="button" id="cmp-prev">previous</button><span id="cmp-page"></span><button type="button" id="cmp-next">next</button></div>
</section>
<section id="browse">
<h2>Debates</h2>
<div class="controls">
<label>set <select id="set"></select></label>
<span class="group"><button type="button" id="filter-all" aria-pressed="true">all</button><button type="button" id="filter-correct" aria-pressed="false">correct only</button><button type="button" id="filter-wrong" aria-pressed="false">wrong only</button></span>
<label>sort <select id="sort"><option value="order">file order</option><option value="u_sys">U_sys, highest first</option><option value="u_intra">U_intra, highest first</option><option value="u_inter">U_inter, highest first</option></select></label>
<label>search <input id="search" type="search" placeholder="question text or id"></label>
</div>
<p id="set-meta" class="meta-line"></p>
<p id="count" class="count"></p>
<div id="debates" class="list"></div>
<div class="pager"><button type="button" id="prev">previous</button><span id="page"></span><button type="button" id="next">next</button></div>
<p class="legend-line"><span class="cell gold">gold</span> the gold answer <span class="cell wrong">7</span> another answer
<span class="cell none">None</span> unparsed <span class="cell wrong cut">7</span> cut at the token limit</p>
</section>
<script type="application/json" id="udpo-data">{script_json(page_data(runs))}</script>
<script>{js}</script>
</body>
</html>
"""
