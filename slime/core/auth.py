"""The job's secret: one random token per job instance, for its Ray cluster and its HTTP servers.

The head's bootstrap makes it (``new_secret``: ``tasks/<i>/auth/secret-<instance>``, dir 0700, file
0600, older instances' files removed, so a requeued job gets a new one). Processes find it through
``$SLIME_JOB_SECRET_FILE`` (a path, never the value), Ray through ``RAY_AUTH_TOKEN_PATH`` with
``RAY_AUTH_MODE=token`` (``ray_auth_env``). Servers check ``Authorization: Bearer <secret>``
(``bearer_middleware``: 401 without it, 403 with another); clients send it (``auth_headers``).
``SLIME_JOB_AUTH=off`` turns all of it off (benchmarks, comparisons). See docs/security.md.
"""

from __future__ import annotations

import hmac
import os
import secrets
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "AUTH_ENV",
    "SECRET_ENV",
    "auth_enabled",
    "auth_headers",
    "bearer_middleware",
    "check_bearer",
    "http_refused",
    "job_secret",
    "new_secret",
    "ray_auth_env",
    "secret_path",
    "write_private",
]

SECRET_ENV = "SLIME_JOB_SECRET_FILE"
AUTH_ENV = "SLIME_JOB_AUTH"
OPEN_PATHS = ("/health",)  # a liveness bit for probes, as SGLang leaves /health open


def auth_enabled() -> bool:
    return os.environ.get(AUTH_ENV, "on").strip().lower() not in ("0", "off", "false", "no")


def secret_path(auth_dir: Path, instance: str) -> Path:
    return auth_dir / f"secret-{instance}"


def new_secret(auth_dir: Path, instance: str) -> Path:
    """A fresh secret for ``instance`` in ``auth_dir`` (0700), written 0600; other instances' are removed."""
    auth_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(auth_dir, 0o700)
    path = secret_path(auth_dir, instance)
    for old in auth_dir.glob("secret-*"):  # also what was derived from them (e.g. SGLang's config)
        if old != path:
            old.unlink(missing_ok=True)
    write_private(path, secrets.token_hex(32))
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (0600 from creation), atomically."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ray_auth_env(path: Path) -> dict[str, str]:
    """What every process of the job gets: Ray's token mode reading ``path``, and ``path`` for our clients."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path), SECRET_ENV: str(path)}


def job_secret() -> str | None:
    """This job's secret (read from ``$SLIME_JOB_SECRET_FILE``), or None outside a job or with auth off."""
    path = os.environ.get(SECRET_ENV)
    if not path or not auth_enabled():
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def auth_headers(secret: str | None = None) -> dict[str, str]:
    secret = secret if secret is not None else job_secret()
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def check_bearer(header: str | None, secret: str) -> bool:
    """``header`` is ``Bearer <secret>`` (compared in constant time)."""
    scheme, _, value = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), secret.encode())


def bearer_middleware(secret: str, open_paths: Iterable[str] = OPEN_PATHS) -> Any:
    """An aiohttp middleware refusing requests without the secret: 401 (none given) or 403 (another)."""
    from aiohttp import web

    open_paths = frozenset(open_paths)

    @web.middleware
    async def require_secret(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        header = request.headers.get("Authorization")
        if not header:
            return web.json_response({"error": {"message": "authentication required"}}, status=401)
        if not check_bearer(header, secret):
            return web.json_response({"error": {"message": "invalid credentials"}}, status=403)
        return await handler(request)

    return require_secret


def http_refused(url: str, path: str = "/get_model_info", timeout: float = 10.0) -> str | None:
    """None when ``url`` refuses a request without credentials (401/403); else what it did instead."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout) as resp:
            return f"{url}{path} answered HTTP {resp.status} to a request without credentials"
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return None
        return f"{url}{path} answered HTTP {exc.code} (not 401/403) to a request without credentials"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}{path} could not be reached to check it: {exc}"
