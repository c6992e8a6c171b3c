"""Read the ``train.py`` flags out of a slime launch script (or a bare flag list), without running bash.

Handled: continuations, comments, quoting and escapes, arrays and ``${NAME[@]}``, scalar
assignments and ``$X``/``${X:-default}``, integer ``$(( ))``, redirections and statement
separators. Each word keeps its line; flag-like statements right after the command (a missing
trailing backslash) go to ``Script.early_end``.
Not handled, reported in ``Script.notes``: ``$(...)`` is never run, sourced files are not read (the
caller may pass their text), unassigned (environment) variables are left as written.
Guaranteed: never executes anything and never raises on any input text.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

__all__ = ["Script", "Word", "read_script"]

_TERMINATORS = " \t\r\n;|&()<>"
_REDIRECT = re.compile(r"(\d*)(&>>|&>|>>|>&|<&|>|<)(\d+|-)?")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
_ARRAY_REF = re.compile(r"^\$\{([A-Za-z_]\w*)\[[@*]\]\}$")
_EXPANSION = re.compile(
    r"\$\(\((?P<arith>.*?)\)\)|\$\((?P<cmd>.*?)\)|\$\{(?P<brace>[^}]*)\}|\$(?P<bare>[A-Za-z_]\w*)", re.S
)
_TRAIN_SCRIPT = re.compile(r"(^|/)train\w*\.py$")


@dataclass(frozen=True, slots=True)
class Word:
    """One shell word after quote removal and expansion, and the line it was written on."""

    text: str
    line: int


@dataclass(slots=True)
class Script:
    """What was read: the flag words, the entry script if any, and what could not be resolved."""

    words: list[Word] = field(default_factory=list)
    entry: str | None = None  # 'train.py', 'train_async.py', ... or None for a bare flag list
    entry_line: int | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)  # (what, why)
    unknown_arrays: list[Word] = field(default_factory=list)
    # statements right after the command that look like more of its flags but are not part of it (a
    # missing trailing backslash): (their first line, the command's last line, their words)
    early_end: list[tuple[int, int, str]] = field(default_factory=list)


# ----------------------------------------------------------------------------- lexing
def _balanced(text: str, k: int) -> int:
    """Index just past the bracket that closes text[k] ('(' or '{'), quotes respected."""
    close = {"(": ")", "{": "}"}[text[k]]
    depth, i = 0, k
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and close == ")":
            j = text.find("'", i + 1)
            i = len(text) if j < 0 else j + 1
            continue
        if c == text[k]:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def _tokens(text: str) -> list[tuple]:
    """('word', [(text, expandable)], line) | ('op', text, line) | ('nl', '\\n', line)."""
    out: list[tuple] = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\\" and text.startswith("\n", i + 1):
            i, line = i + 2, line + 1
        elif c in " \t\r":
            i += 1
        elif c == "\n":
            out.append(("nl", "\n", line))
            i, line = i + 1, line + 1
        elif c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith(("&&", "||", ";;"), i):
            out.append(("op", text[i : i + 2], line))
            i += 2
        elif (m := _REDIRECT.match(text, i)) is not None:
            i = m.end()
            if m.group(3) is None:  # '> file': the target word goes too
                while i < n and text[i] in " \t":
                    i += 1
                _, i, line = _word(text, i, line)
        elif c in ";|&()":
            out.append(("op", c, line))
            i += 1
        else:
            segs, i, line2 = _word(text, i, line)
            out.append(("word", segs, line))
            line = line2
    return out


def _word(text: str, i: int, line: int) -> tuple[list[tuple[str, bool]], int, int]:
    """One word as (text, expandable) pieces: unquoted runs and "double-quoted" text expand,
    'single-quoted' text and backslash escapes do not. Quote boundaries are kept ("$A"B is $A, then B)."""
    segs: list[tuple[str, bool]] = []
    run = False  # the last piece is an unquoted run that more unquoted text extends

    def unquoted(piece: str) -> None:
        nonlocal run
        if run:
            segs[-1] = (segs[-1][0] + piece, True)
        else:
            segs.append((piece, True))
        run = True

    n = len(text)
    while i < n and text[i] not in _TERMINATORS:
        c = text[i]
        if c == "\\":
            if text.startswith("\n", i + 1):
                i, line = i + 2, line + 1
                continue
            segs.append((text[i + 1 : i + 2], False))
            i += 2
        elif c == "'":
            j = text.find("'", i + 1)
            j = n if j < 0 else j
            segs.append((text[i + 1 : j], False))
            line += text.count("\n", i, j)
            i = j + 1
        elif c == '"':
            i, line = _double_quoted(text, i, line, segs)
        elif c == "$" and i + 1 < n and text[i + 1] in "({":
            j = _balanced(text, i + 1)
            unquoted(text[i:j])
            line += text.count("\n", i, j)
            i = j
            continue
        else:
            unquoted(c)
            i += 1
            continue
        run = False
    return segs, i, line


def _double_quoted(text: str, i: int, line: int, segs: list[tuple[str, bool]]) -> tuple[int, int]:
    """Append the pieces of the "double-quoted" text opening at text[i] to segs; the index past it and the line."""
    n = len(text)
    i += 1
    buf: list[str] = []
    while i < n and text[i] != '"':
        if text[i] == "\\" and i + 1 < n and text[i + 1] in '"\\$`\n':
            if text[i + 1] == "\n":
                line += 1
            else:
                segs.append(("".join(buf), True))
                segs.append((text[i + 1], False))
                buf = []
            i += 2
        elif text[i] == "$" and i + 1 < n and text[i + 1] in "({":
            j = _balanced(text, i + 1)
            buf.append(text[i:j])
            line += text.count("\n", i, j)
            i = j
        else:
            line += text[i] == "\n"
            buf.append(text[i])
            i += 1
    segs.append(("".join(buf), True))
    return i + 1, line


# ----------------------------------------------------------------------------- expansion
_ARITH_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.floordiv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _arith(expr: str) -> int | None:
    """Integer arithmetic as bash does it, or None for anything else (never eval)."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (right > 64 or right < 0):
                raise ValueError
            return _ARITH_OPS[type(node.op)](left, right)
        raise ValueError

    try:
        value = ev(ast.parse(expr.strip(), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, OverflowError):
        return None
    return value if abs(value) < 1 << 63 else None


class _Env:
    def __init__(self) -> None:
        self.vars: dict[str, str] = {}
        self.arrays: dict[str, list[Word]] = {}
        self.notes: list[tuple[str, str]] = []

    def note(self, what: str, why: str) -> None:
        if (what, why) not in self.notes:
            self.notes.append((what, why))

    def _var(self, name: str, default: str | None, raw: str) -> str:
        if name in self.vars:
            return self.vars[name]
        if name in self.arrays:  # $ARR is its first element
            return self.arrays[name][0].text if self.arrays[name] else ""
        if default is not None:
            return default
        self.note(raw, "variable not assigned in this file (environment?); left as written")
        return raw

    def _sub(self, m: re.Match) -> str:
        raw = m.group(0)
        if m.group("arith") is not None:
            expr = _EXPANSION.sub(self._sub, m.group("arith"))
            expr = re.sub(r"[A-Za-z_]\w*", lambda v: self.vars.get(v.group(0), v.group(0)), expr)
            value = _arith(expr)
            if value is None:
                self.note(raw, "arithmetic that could not be evaluated; left as written")
                return raw
            return str(value)
        if m.group("cmd") is not None:
            self.note(raw, "command substitution is not run; left as written")
            return raw
        name = m.group("brace") if m.group("brace") is not None else m.group("bare")
        dm = re.fullmatch(r"([A-Za-z_]\w*)(?::?[-=](.*))?", name, re.S)
        if not dm:
            self.note(raw, "parameter expansion not understood; left as written")
            return raw
        default = dm.group(2)
        return self._var(dm.group(1), _EXPANSION.sub(self._sub, default) if default is not None else None, raw)

    def expand(self, segs: list[tuple[str, bool]], line: int) -> list[Word] | None:
        """The words one shell word becomes; None for ``${ARR[@]}`` of an array this file never defined."""
        raw = "".join(s for s, _ in segs)
        m = _ARRAY_REF.match(raw)
        if m and all(e for _, e in segs):
            return list(self.arrays[m.group(1)]) if m.group(1) in self.arrays else None
        text = "".join(_EXPANSION.sub(self._sub, s) if e else s for s, e in segs)
        return [Word(text=text, line=line)]


# ----------------------------------------------------------------------------- statements
def _statements(tokens: list[tuple]) -> list[list[tuple]]:
    out: list[list[tuple]] = []
    cur: list[tuple] = []
    in_array = False
    for tok in tokens:
        kind, value = tok[0], tok[1]
        if in_array and kind in ("nl", "op") and value not in ("(", ")"):
            continue
        if kind == "nl" or (kind == "op" and value in (";", "&&", "||", "|", "&", ";;")):
            if cur:
                out.append(cur)
            cur = []
        elif (
            kind == "op"
            and value == "("
            and cur
            and cur[-1][0] == "word"
            and "".join(s for s, _ in cur[-1][1]).endswith("=")
        ):
            in_array = True
            cur.append(tok)
        elif kind == "op" and value == ")" and in_array:
            in_array = False
            cur.append(tok)
        else:
            cur.append(tok)
    if cur:
        out.append(cur)
    return out


_DECLARE = {"export", "local", "declare", "readonly", "typeset"}


def _shown(cmd: list[Word], limit: int = 80) -> str:
    """The words of a statement for a message: whole when short, else cut at a word with the count."""
    text = " ".join(w.text.lstrip("\0") for w in cmd)
    if len(text) <= limit:
        return text
    kept = text[:limit].rsplit(" ", 1)[0]
    return f"{kept} ... ({len(cmd) - len(kept.split())} more words)"


def _undeclared(stmt: list[tuple]) -> list[tuple]:
    """The statement's tokens without a leading ``export``/``declare``/... and its options."""
    words = list(stmt)
    while words and words[0][0] == "word" and "".join(s for s, _ in words[0][1]) in _DECLARE:
        words = words[1:]
        while words and words[0][0] == "word" and "".join(s for s, _ in words[0][1]).startswith("-"):
            words = words[1:]  # declare -a / export -n
    return words


def _array_assignment(words: list[tuple], env: _Env) -> list[Word] | None:
    """For ``NAME=( ... )``/``NAME+=( ... )``: record the array in ``env``, return the items; else None."""
    if not (len(words) >= 2 and words[0][0] == "word" and words[1][:2] == ("op", "(")):
        return None
    m = _ASSIGN.match("".join(s for s, _ in words[0][1]))
    if not m:
        return None
    items: list[Word] = []
    for tok in words[2:]:
        if tok[0] != "word":
            continue
        expanded = env.expand(tok[1], tok[2])
        items.extend(expanded if expanded is not None else [Word("".join(s for s, _ in tok[1]), tok[2])])
    env.arrays[m.group(1)] = (env.arrays.get(m.group(1), []) if m.group(2) else []) + items
    return items


def _command(words: list[tuple], env: _Env) -> list[Word]:
    """The expanded words of a command; leading ``NAME=value`` assignments go into ``env`` instead."""
    cmd: list[Word] = []
    for tok in words:
        if tok[0] != "word":
            continue
        if not cmd:
            expanded = env.expand(tok[1], tok[2]) or []
            m = _ASSIGN.match(expanded[0].text) if len(expanded) == 1 else None
            if m and not expanded[0].text.startswith("-"):
                value = m.group(3)
                env.vars[m.group(1)] = (env.vars.get(m.group(1), "") if m.group(2) else "") + value
                continue
        expanded = env.expand(tok[1], tok[2])
        if expanded is None:
            unknown = Word("".join(s for s, _ in tok[1]), tok[2])
            cmd.append(Word(text="\0" + unknown.text, line=unknown.line))  # marked: undefined array
        else:
            cmd.extend(expanded)
    return cmd


def _settle(script: Script, loose: list[Word], env: _Env) -> None:
    """Fill in the flag words, the unknown arrays and the notes that concern them."""
    if script.entry is None:
        script.words = loose
    script.unknown_arrays = [Word(w.text[1:], w.line) for w in script.words if w.text.startswith("\0")]
    script.words = [w for w in script.words if not w.text.startswith("\0")]
    used = [w.text for w in script.words] + [w.text for w in script.unknown_arrays]
    script.notes = [
        (what, why) for what, why in env.notes if what.startswith("source ") or any(what in text for text in used)
    ]


def _define(text: str, env: _Env) -> None:
    """The assignments of a file the script sources (``sourced``): its arrays and variables, nothing run."""
    try:
        statements = _statements(_tokens(text))
    except RecursionError:
        return
    for stmt in statements:
        words = _undeclared(stmt)
        if _array_assignment(words, env) is None:
            _command(words, env)  # only its leading NAME=value assignments stay, in env


def read_script(text: str, sourced: tuple[str, ...] = ()) -> Script:
    """The flags of the last ``train*.py`` command in ``text`` (or, without one, every flag in it).

    ``sourced``: the text of files the script sources (given by the caller, not found by guessing): their
    assignments (e.g. ``MODEL_ARGS``) are defined before the script's own."""
    env = _Env()
    for inner in sourced:
        _define(inner, env)
    script = Script()
    loose: list[Word] = []  # without a train.py command: array contents and flag-list statements, in order
    entry_end: int | None = None  # last line of the train.py command, while flag-like statements follow it
    try:
        statements = _statements(_tokens(text))
    except RecursionError:
        statements = []
    for stmt in statements:
        words = _undeclared(stmt)
        items = _array_assignment(words, env)
        if items is not None:
            loose.extend(items)
            continue
        cmd = _command(words, env)
        if not cmd:
            continue
        if cmd[0].text in ("source", ".") and len(cmd) > 1:
            env.note(
                f"source {cmd[1].text}",
                "sourced files are not read (arrays defined there, such as MODEL_ARGS, are unknown here)",
            )
            continue
        entry = next((i for i, w in enumerate(cmd) if _TRAIN_SCRIPT.search(w.text)), None)
        lines = [tok[2] for tok in words if tok[0] == "word"]
        if entry is not None:
            script.entry, script.entry_line = cmd[entry].text, cmd[entry].line
            script.words = cmd[entry + 1 :]
            script.early_end, entry_end = [], max(lines)
            continue
        if entry_end is not None and cmd[0].text.lstrip("\0").startswith(("--", "${")):
            script.early_end.append((lines[0], entry_end, _shown(cmd)))
        else:
            entry_end = None  # another command: what follows it is not the train.py command's
        if cmd[0].text.startswith("--"):
            loose.extend(cmd)
    _settle(script, loose, env)
    return script
