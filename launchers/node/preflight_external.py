"""The preflight's ``external_engine`` checks: each ``rollout.external`` address, from the head.

Per address: ``/health`` answers (reachable), ``/get_model_info`` names ``model.path`` (the model it
serves) and, unless ``rollout.external_frozen``, ``/update_weights_from_disk`` exists and takes the
token: probed with an empty body, which an engine refuses as a bad request (400/422) without loading
anything, while a missing route answers 404 and a refused token 401/403. The token is the value of the
``rollout.external_token_secret`` variable (never written to the report). Stdlib ``urllib``: three
plain requests per engine need no client library (the engine client is training code).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from launchers.node.preflight_checks import Check
from slime.spec.types import Spec

__all__ = ["external_checks"]

TIMEOUT_S = 5.0


def _call(url: str, token: str, *, post: bool = False) -> tuple[int | None, Any]:
    """``(HTTP status, JSON body or text)``; status None when nothing answered (the reason as body)."""
    req = urllib.request.Request(url, data=b"{}" if post else None, method="POST" if post else "GET")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            status, text = resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return None, str(getattr(exc, "reason", exc))
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _same_model(served: Any, expected: str) -> bool:
    if not isinstance(served, str) or not served:
        return False
    return served == expected or os.path.realpath(served) == os.path.realpath(expected)


def _probe(addr: str, spec: Spec, token: str) -> tuple[dict[str, Any], str | None, str | None]:
    """One address: ``(report row, problem or None, fix)``."""
    base, r = f"http://{addr}", spec.rollout
    row: dict[str, Any] = {"address": addr, "reachable": False, "model": None, "weights": None}
    status, body = _call(base + "/health", token)
    if status is None or status >= 400:
        why = body if status is None else f"HTTP {status}"
        return row, f"{addr} is unreachable ({why})", f"start the engine at {addr}, or remove it from rollout.external"
    row["reachable"] = True
    auth_fix = "set rollout.external_token_secret to the cluster.secrets entry holding the engines' token"
    status, body = _call(base + "/get_model_info", token)
    if status in (401, 403):
        return row, f"{addr} refused the token (HTTP {status})", auth_fix
    served = body.get("model_path") if isinstance(body, dict) else None
    row["model"] = served
    expected = str(spec.model.path)
    if not _same_model(served, expected):
        return (
            row,
            f"{addr} serves {served!r}, not model.path {expected!r}",
            "point rollout.external at engines serving model.path, or set model.path to what they serve",
        )
    if r.external_frozen:
        row["weights"] = "frozen (declared)"
        return row, None, None
    status, body = _call(base + "/update_weights_from_disk", token, post=True)
    if status in (400, 422):
        row["weights"] = "accepts updates"
        return row, None, None
    row["weights"] = f"HTTP {status}" if status is not None else "no answer"
    if status in (401, 403):
        return row, f"{addr} refused a weight update with the token (HTTP {status})", auth_fix
    return (
        row,
        f"{addr} does not take weight updates (/update_weights_from_disk answered {row['weights']})",
        "serve an engine with the SGLang weight-update API, or set rollout.external_frozen: true",
    )


def external_checks(spec: Spec, env: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], list[Check]]:
    """The report rows and checks of every external address (none without ``rollout.external``)."""
    r = spec.rollout
    if not r.external:
        return [], []
    env = dict(os.environ) if env is None else env
    token = env.get(r.external_token_secret, "") if r.external_token_secret else ""
    if r.external_token_secret and not token:
        fix = f"export it through cluster.secrets.{r.external_token_secret}"
        msg = f"${r.external_token_secret} (rollout.external_token_secret) is empty or unset in the job"
        return [], [Check(name="external_engine", ok=False, message=msg, fix=fix)]
    rows, checks = [], []
    for addr in r.external:
        row, problem, fix = _probe(addr, spec, token)
        row["ok"] = problem is None
        rows.append(row)
        msg = problem or f"{addr} serves {Path(str(row['model'])).name}; weights: {row['weights']}"
        checks.append(Check(name="external_engine", ok=problem is None, message=msg, fix=fix))
    return rows, checks
