"""Write ``server_args.json``: every flag of ``sglang.launch_server``, parsed from a pinned SGLang wheel.

``python -m slime.backends.sglang.gen_server_args sglang-<version>-<tag>.whl`` (from ``pip download --no-deps``;
its SHA-256 is checked against patches/pins.toml). Nothing is imported from the wheel: its source is read with
``ast``. In 0.5.x ``ServerArgs.add_cli_args`` registers (1) each field ``name: A[T, "help"]`` or
``A[T, Arg(...)]`` of the namespace classes in ``_INPUT_NAMESPACES`` (``arg_groups/fields/*.py``) as
``--name`` with ``_`` -> ``-`` or ``Arg(cli_name=...)``, plus ``Arg(aliases=[...])``, skipping
``Arg(no_cli=True)`` and ``Derived(...)`` (arg_groups/arg_utils.py ``add_cli_args_from_dataclass``); (2) the
``parser.add_argument("--flag", ...)`` calls in ``add_cli_args`` itself. An unreadable annotation fails the run.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import tomllib
import zipfile
from pathlib import Path

OUT = Path(__file__).with_name("server_args.json")
PINS = Path(__file__).resolve().parents[3] / "patches" / "pins.toml"
SERVER_ARGS = "sglang/srt/server_args.py"


def _literal(node: ast.AST, where: str):
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise SystemExit(f"{where}: not a literal: {ast.unparse(node)}") from None


def _field_flags(name: str, annotation: ast.AST, where: str) -> list[str]:
    """The flags of one namespace field (none for a field without CLI metadata), as add_cli_args_from_dataclass."""
    if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in ("A", "Annotated")):
        return []
    meta = annotation.slice.elts[1:] if isinstance(annotation.slice, ast.Tuple) else []
    for m in meta:  # the first Arg(...) or help string decides
        if isinstance(m, ast.Constant) and isinstance(m.value, str):
            return ["--" + name.replace("_", "-")]
        if isinstance(m, ast.Call) and ast.unparse(m.func) == "Arg":
            kw = {k.arg: _literal(k.value, f"{where}.{name}") for k in m.keywords if k.arg in _ARG_KEYS}
            if kw.get("no_cli"):
                return []
            return [kw.get("cli_name") or "--" + name.replace("_", "-"), *(kw.get("aliases") or [])]
        if not (isinstance(m, ast.Call) and ast.unparse(m.func) == "Derived"):
            raise SystemExit(f"{where}.{name}: unreadable field metadata {ast.unparse(m)}")
    return []


_ARG_KEYS = ("cli_name", "aliases", "no_cli")


def _namespaces(tree: ast.Module) -> dict[str, str]:
    """``_INPUT_NAMESPACES``' class names -> the module (path in the wheel) each is imported from."""
    listed = next(
        [ast.unparse(e) for e in n.value.elts]
        for n in tree.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_INPUT_NAMESPACES"
    )
    origin = {
        a.asname or a.name: n.module.replace(".", "/") + ".py"
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and n.module
        for a in n.names
    }
    return {cls: origin[cls] for cls in listed}


def _class_flags(source: str, cls: str, where: str) -> list[str]:
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return [
        flag
        for n in body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        for flag in _field_flags(n.target.id, n.annotation, f"{where}:{cls}")
    ]


def _manual_flags(tree: ast.Module) -> list[str]:
    """The ``parser.add_argument("--flag", ...)`` calls in ``ServerArgs.add_cli_args``."""
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    return [
        a.value
        for call in ast.walk(fn)
        if isinstance(call, ast.Call) and ast.unparse(call.func).endswith(".add_argument")
        for a in call.args
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
    ]


def _assignments(source: str) -> dict:
    """The literal ``name = ... = value`` assignments of a generated file (sglang/_version.py)."""
    return {
        t.id: ast.literal_eval(n.value)
        for n in ast.parse(source).body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }


def server_args(wheel: Path) -> dict:
    """{"sglang": version, "source": {...}, "flags": sorted names without dashes} parsed from ``wheel``."""
    data = wheel.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    pin = tomllib.loads(PINS.read_text())["sglang"]
    if pin["sha256"].get(wheel.name) != digest:
        raise SystemExit(f"{wheel.name}: not a wheel pinned in {PINS} (sha256 {digest})")
    with zipfile.ZipFile(wheel) as z:
        version = _assignments(z.read("sglang/_version.py").decode())
        tree = ast.parse(z.read(SERVER_ARGS).decode())
        flags = _manual_flags(tree)
        for cls, module in _namespaces(tree).items():
            flags += _class_flags(z.read(module).decode(), cls, module)
    return {
        "sglang": version["__version__"],
        "source": {"wheel": wheel.name, "sha256": digest, "commit": version.get("__commit_id__")},
        "flags": sorted({f.lstrip("-") for f in flags}),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    OUT.write_text(json.dumps(server_args(Path(argv[0])), indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
