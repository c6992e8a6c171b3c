"""The report's rollout viewer: which saved samples the page embeds, as an index and page-sized JSON chunks.

Why chunks in the page, not a reader of the Parquet files: a report is one file opened from disk, where
a page cannot read other files. So it carries an index of the samples' small fields (filters and sorts
run on it) and their whole records in chunks of ``CHUNK``, each a ``<script type="application/json">``
that the browser parses only when a page or a sample needs it. At most ``max_samples`` are embedded
(whole rollouts spread from the first saved to the last, or the ones asked for), so a large run's page
stays small; ``slime-submit rollouts`` pages through every saved sample from the files.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime.cli import rollout_store as store

__all__ = ["CHUNK", "DEFAULT_MAX_SAMPLES", "Embedded", "choose", "embed", "viewer_html"]

CHUNK = 64  # samples per JSON chunk
PREVIEW = 80  # characters of prompt/response in the index (the table's columns)
DEFAULT_MAX_SAMPLES = 2048
INDEX_COLS = ("src", "rollout", "group", "index", "reward", "status", "version", "len", "chunk", "pos")
INDEX_COLS += ("prompt", "response")


@dataclass
class Embedded:
    """What the page carries: per source (run/task) what was saved and what is embedded."""

    sources: list[dict[str, Any]] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    chunks: list[list[dict[str, Any]]] = field(default_factory=list)


def choose(ids: list[int], counts: dict[int, int], max_samples: int) -> list[int]:
    """Whole rollouts to embed: the most, evenly spread over ``ids`` (first and last included), whose
    samples fit in ``max_samples``; the last one alone when even it does not fit (it is then cut)."""
    if not ids:
        return []

    def spread(k: int) -> list[int]:
        if k == 1:
            return [ids[-1]]
        return sorted({ids[round(j * (len(ids) - 1) / (k - 1))] for j in range(k)})

    lo, hi = 1, len(ids)
    while lo < hi:  # the largest k whose spread fits (sums grow with k, nearly monotonically)
        mid = (lo + hi + 1) // 2
        if sum(counts[i] for i in spread(mid)) <= max_samples:
            lo = mid
        else:
            hi = mid - 1
    return spread(lo)


def _r(x: float, digits: int) -> float | None:
    return float(f"{x:.{digits}g}") if math.isfinite(x) else None


def _detail(s: dict[str, Any], vocab: dict[int, str] | None) -> dict[str, Any]:
    tlp = s["trainer_lp"]
    lp = s["engine_lp"]
    pairs = zip(tlp, lp) if tlp is not None and len(tlp) == len(lp) else None
    return {
        "prompt": s["prompt"],
        "plen": s["prompt_len"],
        "response": s["response"],
        "label": _clean(s["label"]),
        "ids": s["tokens"],
        "tok": [vocab.get(t, f"<{t}>") if vocab else f"<{t}>" for t in s["tokens"]],
        "lp": [_r(x, 4) for x in lp],
        "tlp": [_r(x, 4) for x in tlp] if pairs is not None else None,
        "dlp": [_r(t - e, 3) for t, e in pairs] if pairs is not None else None,
        "mask": [] if all(s["loss_mask"]) else s["loss_mask"],  # empty: every token trained
        "tv": s["token_versions"],
        "meta": _clean(s["metadata"]),
    }


def _clean(v: Any) -> Any:
    """``v`` with non-finite floats as None (the page's JSON has no NaN)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def _preview(text: str) -> str:
    text = text.replace("\n", "⏎ ")
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def embed(sources: list[tuple[str, Path, dict[str, Any]]], max_samples: int, wanted: list[int] | None) -> Embedded:
    """Embed the saved rollouts of each ``(label, task dir, task spec)`` (see the module doc); ``max_samples``
    is per source; ``wanted``: these rollout ids instead of a spread."""
    out = Embedded()
    for label, task_dir, spec in sources:
        rdir = Path(task_dir) / "rollouts"
        ids = store.saved_rollouts(rdir)
        if not ids:
            continue
        counts = {i: store.count_rows(rdir, i) for i in ids}
        chosen = [i for i in ids if i in set(wanted)] if wanted else choose(ids, counts, max_samples)
        vocab = store.vocab(task_dir, spec)
        src = len(out.sources)
        embedded: dict[int, int] = {}
        trainer = False
        for s in store.iter_samples(rdir, chosen, limit=max_samples):
            if not out.chunks or len(out.chunks[-1]) >= CHUNK or out.rows and out.rows[-1][0] != src:
                out.chunks.append([])
            out.chunks[-1].append(_detail(s, vocab))
            trainer = trainer or s["trainer_lp"] is not None
            embedded[s["rollout_id"]] = embedded.get(s["rollout_id"], 0) + 1
            out.rows.append(
                [src, s["rollout_id"], s["group"], s["index"], s["reward"], s["status"], s["version"]]
                + [len(s["tokens"]), len(out.chunks) - 1, len(out.chunks[-1]) - 1]
                + [_preview(s["prompt"]), _preview(s["response"])]
            )
        out.sources.append(
            {
                "label": label,
                "dir": str(rdir),
                "rollouts": [[i, counts[i], embedded.get(i, 0)] for i in ids],
                "trainer_lp": trainer,
                "tokens": "tokenizer.json" if vocab else "ids",
            }
        )
    return out


def _script(id_: str, doc: Any) -> str:
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    text = text.replace("</", "<\\/").replace("<!--", "<\\!--")
    return f'<script type="application/json" id="{id_}">{text}</script>\n'


def _finite(rows: list[list[Any]]) -> list[list[Any]]:
    return [[None if isinstance(v, float) and not math.isfinite(v) else v for v in r] for r in rows]


def _options(values: list[Any], everything: str) -> str:
    opts = [f'<option value="">{html.escape(everything)}</option>']
    opts += [f'<option value="{html.escape(str(v))}">{html.escape(str(v))}</option>' for v in values]
    return "".join(opts)


def _source_note(src: dict[str, Any]) -> str:
    saved = sum(n for _, n, _ in src["rollouts"])
    shown = [f"{i}" + ("" if e == n else f" ({e} of {n})") for i, n, e in src["rollouts"] if e]
    lp = (
        "per token: engine vs trainer log-prob (red: larger difference)"
        if src["trainer_lp"]
        else "per token: the engine's log-prob (blue: less likely); the trainer's log-probs were not saved"
    )
    return (
        f"<li><b>{html.escape(src['label'])}</b>: {len(src['rollouts'])} rollouts saved ({saved} samples) in "
        f"<code>{html.escape(src['dir'])}</code>; embedded here: rollout(s) {html.escape(', '.join(shown))}. "
        f"Tokens as {src['tokens']}; {lp}; grey dotted tokens have loss mask 0.</li>"
    )


_CONTROLS = """<div class="rv-controls">
<label>run/task<select id="rv-src">{src}</select></label>
<label>rollout<select id="rv-rollout">{rollouts}</select></label>
<label>status<select id="rv-status">{status}</select></label>
<label>group<input id="rv-group" type="number"></label>
<label>reward ≥<input id="rv-rmin" type="number" step="any"></label>
<label>reward ≤<input id="rv-rmax" type="number" step="any"></label>
<label>length ≥<input id="rv-lmin" type="number"></label>
<label>length ≤<input id="rv-lmax" type="number"></label>
<label>sort<select id="rv-sort"><option value="order">as saved</option><option value="-reward">reward ↓</option>
<option value="reward">reward ↑</option><option value="-len">length ↓</option><option value="len">length ↑</option>
<option value="group">group</option></select></label>
<label>page size<select id="rv-size"><option>25</option><option selected>50</option><option>200</option>
</select></label>
<button id="rv-prev">◀ prev</button><button id="rv-next">next ▶</button><span id="rv-count" class="note"></span>
</div>"""
_TABLE_HEAD = "".join(
    f"<th>{h}</th>"
    for h in ("run/task", "rollout", "group", "sample", "reward", "status", "version", "len", "prompt", "response")
)


def viewer_html(emb: Embedded) -> str:
    """The viewer's section body: notes, controls, table, detail pane and the embedded JSON."""
    if not emb.sources:
        return '<p class="muted">No saved rollouts (set <code>debug.save_rollouts: true</code> to save them).</p>'
    srcs = [(i, s["label"]) for i, s in enumerate(emb.sources)]
    src_opts = "".join(f'<option value="{i}">{html.escape(label)}</option>' for i, label in srcs)
    if len(srcs) > 1:
        src_opts = '<option value="">every run/task</option>' + src_opts
    controls = _CONTROLS.format(
        src=src_opts,
        rollouts=_options(sorted({r[1] for r in emb.rows}), "every embedded rollout"),
        status=_options(sorted({r[5] for r in emb.rows}), "any"),
    )
    parts = [
        '<ul class="note">' + "".join(_source_note(s) for s in emb.sources) + "</ul>",
        controls,
        f'<table class="rv-table"><thead><tr>{_TABLE_HEAD}</tr></thead><tbody id="rv-body"></tbody></table>',
        '<div id="rv-detail"></div>',
        _script("rv-meta", {"sources": emb.sources, "chunk": CHUNK}),
        _script("rv-index", {"cols": list(INDEX_COLS), "rows": _finite(emb.rows)}),
    ]
    parts += [_script(f"rv-chunk-{n}", chunk) for n, chunk in enumerate(emb.chunks)]
    return "\n".join(parts)
