"""Write ``slime_flags.json``: every flag THUDM/slime's own parser defines, read from a slime git checkout.

``python -m slime.migrate.gen_slime_flags /path/to/slime [COMMIT]`` (a clone with history; bare is fine).
Nothing is imported from slime: ``SOURCES`` are read with ``ast`` at COMMIT (default HEAD), taking each
``add_argument("--flag", ...)`` / ``reset_arg(parser, "--flag", ...)`` call whose names are literals (and
the ``--no-flag`` argparse adds for ``BooleanOptionalAction``).
Flags present in an earlier commit of ``SOURCES`` but not at COMMIT are listed as ``removed`` with the
last commit that had them. SGLang's own server flags (added by ``ServerArgs.add_cli_args`` with a
``--sglang-`` prefix) and the router's are not slime's: the engine tables cover them.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).with_name("slime_flags.json")
SOURCES = ("slime/utils/arguments.py", "slime/backends/sglang_utils/arguments.py")


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def _negatable(call: ast.Call) -> bool:
    """``action=argparse.BooleanOptionalAction``: argparse adds ``--no-<flag>`` too."""
    return any(k.arg == "action" and ast.unparse(k.value).endswith("BooleanOptionalAction") for k in call.keywords)


def _kind(call: ast.Call) -> str:
    """'switch' (store_true/false, BooleanOptionalAction), 'values' (nargs), or 'value'."""
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = kw.get("action")
    if _negatable(call) or (isinstance(action, ast.Constant) and action.value in ("store_true", "store_false")):
        return "switch"
    return "values" if "nargs" in kw else "value"


def _default(call: ast.Call) -> object:
    """The literal default (None when absent), or the source text of a computed one."""
    for k in call.keywords:
        if k.arg == "default":
            try:
                value = ast.literal_eval(k.value)
            except ValueError:
                return ast.unparse(k.value)
            return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
    return None


def flags_in(text: str, source: str) -> dict[str, dict]:
    """--flag -> {source, group, kind, default, via} for one file's literal add_argument/reset_arg calls."""
    out: dict[str, dict] = {}
    tree = ast.parse(text)

    def visit(node: ast.AST, group: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                via = ast.unparse(child.func).rsplit(".", 1)[-1]
                args = child.args[1:] if via == "reset_arg" else child.args
                names = [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if via in ("add_argument", "reset_arg") and names and names[0].startswith("--"):
                    info = {"source": source, "group": group, "kind": _kind(child), "default": _default(child)}
                    negated = ["--no-" + n[2:] for n in names if n.startswith("--")] if _negatable(child) else []
                    for name in names + negated:
                        out.setdefault(name, info | {"via": via})
            visit(child, group)

    visit(tree, "")
    return out


def _at(repo: str, commit: str) -> dict[str, dict]:
    flags: dict[str, dict] = {}
    for source in SOURCES:
        try:
            text = _git(repo, "show", f"{commit}:{source}")
        except subprocess.CalledProcessError:
            continue  # the file did not exist yet
        try:
            flags.update(flags_in(text, source))
        except SyntaxError:
            continue
    return flags


def generate(repo: str, commit: str = "HEAD") -> dict:
    sha = _git(repo, "rev-parse", commit).strip()
    current = _at(repo, sha)
    removed: dict[str, str] = {}
    for old in _git(repo, "log", "--format=%H", sha, "--", *SOURCES).split():  # newest first
        for name in _at(repo, old):
            if name not in current and name not in removed:
                removed[name] = old  # the newest commit that still had it
    return {
        "slime_commit": sha,
        "sources": list(SOURCES),
        "flags": dict(sorted(current.items())),
        "removed": {name: {"last_seen": c} for name, c in sorted(removed.items())},
    }


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m slime.migrate.gen_slime_flags SLIME_REPO [COMMIT]", file=sys.stderr)
        return 2
    table = generate(argv[0], argv[1] if len(argv) > 1 else "HEAD")
    OUT.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    print(f"{OUT}: {len(table['flags'])} flags, {len(table['removed'])} removed, slime {table['slime_commit'][:9]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
