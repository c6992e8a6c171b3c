"""Tools an agent can call, executed inside a sandbox: ``python`` and ``calculator``.

A :class:`Tool`'s async ``run(sandbox, arguments, timeout)`` never raises for bad arguments,
failing code or a timeout: the :class:`ToolResult` text is what the model gets (``ok`` False on
errors). It raises only when the sandbox itself fails. ``calculator`` is exact (fractions) and runs
in the sandbox too, so its CPU and wall limits cut off ``9**9**9``. Long outputs are cut
(``...[truncated]``): every character becomes prompt tokens. Register more with ``TOOLS.register``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slime.agent.sandbox.base import Sandbox, text_problem
from slime.core.registry import Registry

__all__ = ["CALCULATOR", "PYTHON", "TOOLS", "Tool", "ToolResult", "get_tools"]


@dataclass(frozen=True)
class ToolResult:
    output: str
    ok: bool
    timed_out: bool = False


Runner = Callable[[Sandbox, dict[str, Any], float, int], Awaitable[ToolResult]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object
    runner: Runner

    async def run(
        self, sandbox: Sandbox, arguments: Any, *, timeout: float, max_output_chars: int = 2000
    ) -> ToolResult:
        if not isinstance(arguments, dict):
            return ToolResult(f"error: arguments of {self.name} must be an object", ok=False)
        for key in self.parameters.get("required", ()):
            if not isinstance(arguments.get(key), str):
                return ToolResult(f"error: {self.name} needs {key!r} (a string)", ok=False)
            # A NUL or lone surrogate (JSON "\u0000", "\ud800") cannot reach a process: the
            # sandbox would refuse it with an exception, which must not end the rollout.
            if (problem := text_problem(arguments[key])) is not None:
                return ToolResult(f"error: {self.name} {key!r} {problem}", ok=False)
        return await self.runner(sandbox, arguments, timeout, max_output_chars)

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def anthropic_schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "...[truncated]"


async def _run_python(sandbox: Sandbox, args: dict[str, Any], timeout: float, limit: int) -> ToolResult:
    res = await sandbox.exec(["python3", "-c", args["code"]], timeout=timeout)
    if res.timed_out:
        return ToolResult(_cut(res.stdout, limit) + f"error: timed out after {timeout:g} s", ok=False, timed_out=True)
    if res.returncode != 0:
        return ToolResult(_cut(f"{res.stdout}{res.stderr}exit code {res.returncode}", limit), ok=False)
    return ToolResult(_cut(res.stdout, limit), ok=True)


# Runs inside the sandbox: argv[1] is the expression. Exact arithmetic on Fractions.
_CALC_PROGRAM = r"""
import ast, operator, re, sys
from fractions import Fraction
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
def ev(n):
    if isinstance(n, ast.Constant) and type(n.value) in (int, float):
        return Fraction(str(n.value))
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.UAdd, ast.USub)):
        v = ev(n.operand)
        return -v if isinstance(n.op, ast.USub) else v
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow):
        b, e = ev(n.left), ev(n.right)
        if e.denominator == 1 and abs(e) <= 100000:
            return b ** int(e)
        return Fraction(float(b) ** float(e))
    if isinstance(n, ast.BinOp) and type(n.op) in OPS:
        return OPS[type(n.op)](ev(n.left), ev(n.right))
    raise ValueError("not an arithmetic expression (numbers, + - * / // % ** and parentheses only)")
try:
    src = re.sub(r"(?<![\w.])0+(?=\d)", "", sys.argv[1].strip())
    r = ev(ast.parse(src, mode="eval").body)
    print(r.numerator if r.denominator == 1 else format(float(r), ".12g"))
except ZeroDivisionError:
    sys.exit("error: division by zero")
except OverflowError:
    sys.exit("error: number too large")
except (SyntaxError, ValueError, TypeError) as e:
    sys.exit("error: " + (str(e) if isinstance(e, ValueError) else "not an arithmetic expression"))
"""


async def _run_calculator(sandbox: Sandbox, args: dict[str, Any], timeout: float, limit: int) -> ToolResult:
    res = await sandbox.exec(["python3", "-I", "-S", "-c", _CALC_PROGRAM, args["expression"]], timeout=timeout)
    if res.timed_out:
        return ToolResult(f"error: timed out after {timeout:g} s", ok=False, timed_out=True)
    if res.returncode != 0:
        message = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit code {res.returncode}"
        if not message.startswith("error:"):
            message = f"error: {message}"  # e.g. killed by the memory limit
        return ToolResult(_cut(message, limit), ok=False)
    return ToolResult(_cut(res.stdout.strip(), limit), ok=True)


PYTHON = Tool(
    "python",
    "Run Python code; print what you need.",
    {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    _run_python,
)

CALCULATOR = Tool(
    "calculator",
    "Evaluate an arithmetic expression exactly.",
    {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    _run_calculator,
)

TOOLS = Registry("agent tool", {"python": "slime.agent.tools:PYTHON", "calculator": "slime.agent.tools:CALCULATOR"})


def get_tools(names: Sequence[str]) -> list[Tool]:
    """The tools named in ``agent.tools`` (``UnknownPlugin`` lists valid names for a typo)."""
    out = []
    for name in names:
        tool = TOOLS.get(name)
        if not isinstance(tool, Tool):
            raise TypeError(f"agent tool {name!r} is a {type(tool).__name__}, not slime.agent.tools.Tool")
        if any(t.name == tool.name for t in out):
            raise ValueError(f"agent.tools lists {tool.name!r} twice")
        out.append(tool)
    return out
