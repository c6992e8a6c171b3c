"""THE quoting helper: every value that reaches a generated script goes through here.

Two languages: bash (:func:`q` is ``shlex.quote``; :func:`export_line`, :func:`assign_line`) and
``#SBATCH`` lines (:func:`sbatch_line`), which sbatch's own tokenizer reads: there ``shlex.quote`` is
wrong, so unsafe values are double-quoted with ``\\`` and ``"`` escaped. A newline, CR or NUL cannot
be written in an ``#SBATCH`` line and is rejected; so is a bad environment variable name (names go
unquoted): both as a :class:`~slime.spec.SpecError` naming the field and the fix.
Guaranteed: pure functions; every output is one line, except :func:`q` of a value with newlines.
"""

from __future__ import annotations

import re
import shlex

from slime.spec import Problem, SpecError

__all__ = [
    "ENV_NAME",
    "assign_line",
    "check_env_name",
    "check_single_line",
    "export_line",
    "q",
    "sbatch_line",
    "sbatch_word",
]

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./\-\[\]]+")
_LINE_BREAKS = ("\n", "\r", "\0")


def q(value: object) -> str:
    """``value`` as one bash word that bash reads back exactly (``shlex.quote`` of ``str(value)``)."""
    return shlex.quote(str(value))


def _problem(field: str, message: str, hint: str) -> SpecError:
    return SpecError([Problem(path=field, message=message, hint=hint)])


def check_env_name(name: str, field: str) -> str:
    """``name`` if it is a valid environment variable name, else a SpecError naming ``field``."""
    if not ENV_NAME.fullmatch(name):
        raise _problem(
            field,
            f"{name!r} is not a valid environment variable name",
            "use letters, digits and underscores, not starting with a digit",
        )
    return name


def check_single_line(value: str, field: str) -> str:
    """``value`` if it holds no newline, CR or NUL, else a SpecError naming ``field``."""
    for ch in _LINE_BREAKS:
        if ch in value:
            raise _problem(
                field,
                f"{value!r} contains a line break or NUL ({ch!r}), which cannot be written into an #SBATCH directive",
                "remove the line break from this value",
            )
    return value


def export_line(name: str, value: object, *, field: str = "cluster.env") -> str:
    """``export NAME='value'`` (the name validated, the value quoted by :func:`q`)."""
    return f"export {check_env_name(name, f'{field}.{name}')}={q(value)}"


def assign_line(name: str, value: object, *, field: str = "<internal>") -> str:
    """``NAME='value'`` (a shell variable of the script, not exported)."""
    return f"{check_env_name(name, field)}={q(value)}"


def sbatch_word(value: object, *, field: str) -> str:
    """``value`` as one word of sbatch's ``#SBATCH`` tokenizer (see the module docstring)."""
    text = check_single_line(str(value), field)
    if text and _SBATCH_SAFE.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_line(flag: str, value: object | None = None, *, field: str) -> str:
    """``#SBATCH --flag=value`` (or ``#SBATCH --flag`` when value is None)."""
    if not re.fullmatch(r"[a-z][a-z-]*", flag):
        raise ValueError(f"not an sbatch long option name: {flag!r}")  # a bug in our code, not user input
    if value is None:
        return f"#SBATCH --{flag}"
    return f"#SBATCH --{flag}={sbatch_word(value, field=field)}"
