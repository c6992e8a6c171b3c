"""How ``slime-submit rollouts`` draws samples with rich: a page as a table, one sample, a group side by side.

Per token the difference between the engine's and the trainer's log-prob is coloured green (below
``CLOSE``), yellow (below ``FAR``) or red; without the trainer's the engine's probability is shown.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["print_group", "print_page", "print_sample"]

CLOSE, FAR = 1e-4, 1e-2  # |trainer - engine| log-prob: the colour bands
PREVIEW = 60


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def _short(text: str, n: int = PREVIEW) -> str:
    text = text.replace("\n", "⏎ ")
    return text if len(text) <= n else text[: n - 1] + "…"


def _reward(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def print_page(samples: list[dict[str, Any]], head: str) -> None:
    from rich.table import Table

    t = Table(title=head, title_justify="left", show_lines=False)
    num = {"justify": "right", "no_wrap": True}
    for col, kw in (
        ("roll", num),
        ("grp", num),
        ("#", num),
        ("reward", num),
        ("status", {"no_wrap": True}),
        ("ver", num),
        ("len", num),
        ("label", {"no_wrap": True, "max_width": 12}),
        ("prompt", {"overflow": "ellipsis", "no_wrap": True, "ratio": 1}),
        ("response", {"overflow": "ellipsis", "no_wrap": True, "ratio": 1}),
    ):
        kw = {**kw, "min_width": len(col)} if kw.get("no_wrap") and "ratio" not in kw else kw
        t.add_column(col, **kw)
    for s in samples:
        style = "green" if (s["reward"] or 0) > 0 else None
        t.add_row(
            str(s["rollout_id"]),
            str(s["group"]),
            str(s["index"]),
            _reward(s["reward"]),
            s["status"],
            str(s["version"]),
            str(len(s["tokens"])),
            _short(json.dumps(s["label"]), 20),
            _short(s["prompt"]),
            _short(s["response"]),
            style=style,
        )
    con = _console()
    con.print(t)
    con.print("[dim]--sample I: one sample in full · --group G --side-by-side: a group · --page P: another page[/]")


def _diff_style(d: float) -> str:
    return "green" if d < CLOSE else "yellow" if d < FAR else "bold red"


def _turn_marks(s: dict[str, Any]) -> dict[int, str]:
    agent = (s.get("metadata") or {}).get("agent") or {}
    marks: dict[int, str] = {}
    for k, span in enumerate(agent.get("turn_spans") or []):
        marks[int(span.get("response_start", 0))] = f"turn {span.get('turn_id', k)}"
        end = int(span.get("response_end", 0))
        marks.setdefault(end, "tool/env")
    return marks


def token_table(s: dict[str, Any], vocab: dict[int, str] | None, limit: int):
    from rich.table import Table

    trainer = s.get("trainer_lp")
    t = Table(title="per token", title_justify="left")
    for col in ("#", "turn", "token", "id", "engine lp", "trainer lp", "|diff|", "mask", "version"):
        t.add_column(col, justify="right" if col not in ("token", "turn") else "left")
    marks, n = _turn_marks(s), len(s["tokens"])
    for i in range(n if limit <= 0 else min(n, limit)):
        e = s["engine_lp"][i] if i < len(s["engine_lp"]) else math.nan
        tl = trainer[i] if trainer and i < len(trainer) else None
        d = abs(tl - e) if tl is not None else None
        mask = s["loss_mask"][i] if i < len(s["loss_mask"]) else 1
        tv = s["token_versions"][i] if i < len(s["token_versions"]) else s["version"]
        tok = s["tokens"][i]
        t.add_row(
            str(i),
            marks.get(i, ""),
            repr(vocab.get(tok, "?")) if vocab else "",
            str(tok),
            f"{e:.5f}",
            "-" if tl is None else f"{tl:.5f}",
            "-" if d is None else f"[{_diff_style(d)}]{d:.2e}[/]",
            str(mask) if mask else "[dim]0[/]",
            str(tv),
            style=None if mask else "dim",
        )
    return t, n


def _agent(s: dict[str, Any]):
    from rich.table import Table

    agent = (s.get("metadata") or {}).get("agent")
    if not agent:
        return None
    t = Table(title=f"agent: {agent.get('turns')} turn(s), stop {agent.get('stop')}", title_justify="left")
    for col in ("#", "tool", "arguments", "ok", "output"):
        t.add_column(col)
    for i, c in enumerate(agent.get("tool_calls") or []):
        out = c.get("output")
        t.add_row(
            str(i + 1), str(c.get("name")), json.dumps(c.get("arguments")), str(c.get("ok")), _short(str(out), 80)
        )
    return t


def print_sample(s: dict[str, Any], vocab: dict[int, str] | None, limit: int) -> None:
    from rich.markup import escape
    from rich.panel import Panel

    con = _console()
    head = (
        f"rollout {s['rollout_id']} · group {s['group']} · sample {s['index']} · reward {_reward(s['reward'])} · "
        f"{s['status']} · weight version {s['version']} · label {json.dumps(s['label'])}"
    )
    con.print(f"[bold]{escape(head)}[/]")
    con.print(Panel(escape(s["prompt"]), title=f"prompt ({s['prompt_len']} tokens)", title_align="left"))
    con.print(Panel(escape(s["response"]), title=f"response ({len(s['tokens'])} tokens)", title_align="left"))
    table, n = token_table(s, vocab, limit)
    con.print(table)
    if 0 < limit < n:
        con.print(f"[dim]{n - limit} more token(s): --tokens 0 shows all[/]")
    if s.get("trainer_lp") is None:
        con.print("[dim]the trainer's log-probs were not saved with this rollout: engine log-probs only[/]")
    agent = _agent(s)
    if agent is not None:
        con.print(agent)


def print_group(samples: list[dict[str, Any]], vocab: dict[int, str] | None) -> None:
    from rich.columns import Columns
    from rich.markup import escape
    from rich.panel import Panel

    con = _console()
    if not samples:
        con.print("no sample in that group matches")
        return
    s0 = samples[0]
    con.print(
        f"rollout {s0['rollout_id']} · group {s0['group']} · {len(samples)} samples · prompt: {escape(s0['prompt'])}"
    )
    panels = []
    for s in samples:
        mean = sum(s["engine_lp"]) / len(s["engine_lp"]) if s["engine_lp"] else math.nan
        body = f"{escape(s['response'])}\n[dim]{len(s['tokens'])} tokens · {s['status']} · mean lp {mean:.3f}[/]"
        colour = "green" if (s["reward"] or 0) > 0 else "red"
        panels.append(Panel(body, title=f"#{s['index']} reward [{colour}]{_reward(s['reward'])}[/]", width=36))
    con.print(Columns(panels))
