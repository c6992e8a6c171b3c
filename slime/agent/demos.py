"""SFT warm-up demonstrations in the agent's chat format.

:func:`render_demonstration` turns a transcript into an SFT sample whose loss mask covers exactly
what the model generates; :func:`calculator_demonstration` and :func:`python_demonstration` are the
ideal episodes for an arithmetic prompt and a row with a reference program;
:func:`agent_sft_sample` is what the warm-up uses. Guaranteed: the tokens are the ones the adapter
renders for the same messages, so the warm-up teaches exactly the format the rollouts see.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from slime.agent.tools import Tool, get_tools
from slime.data.chat import render_messages

__all__ = ["agent_sft_sample", "calculator_demonstration", "python_demonstration", "render_demonstration"]


def agent_sft_sample(
    spec: Any, tokenizer: Any, prompt: str, label: str, metadata: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One SFT warm-up sample for an agent spec, in the agent's chat format with its tools listed.

    With the ``python`` tool and a data row carrying its reference ``program`` (row metadata) it is
    :func:`python_demonstration`; with the ``calculator`` tool and an arithmetic prompt (``"07+12="``)
    it is :func:`calculator_demonstration`; otherwise the assistant answers the label directly.
    """
    tools = get_tools(spec.agent.tools if spec.agent is not None else ())
    program = (metadata or {}).get("program")
    if any(t.name == "python" for t in tools) and isinstance(program, str) and program.strip():
        return python_demonstration(tokenizer, prompt, label, program, tools)
    expression = prompt.strip().rstrip("=").strip()
    if any(t.name == "calculator" for t in tools) and prompt.strip().endswith("=") and _ARITH.fullmatch(expression):
        return calculator_demonstration(tokenizer, prompt, label, tools)
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": label}]
    return render_demonstration(tokenizer, messages, tools)


_ARITH = re.compile(r"[\d\s.+\-*/%()]+")


# ----------------------------------------------------------------- demonstrations
def render_demonstration(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool] = ()
) -> dict[str, Any]:
    """An SFT sample ``{tokens, response_length, loss_mask}`` from a chat transcript with the agent's
    tools listed (``slime.data.chat.render_messages``: the loss on assistant turns only)."""
    return render_messages(tokenizer, messages, [t.openai_schema() for t in tools] or None)


def _tool_episode(prompt: str, name: str, arguments: dict[str, Any], output: str, answer: str) -> list[dict]:
    """User prompt → one tool call → its output → the final answer, as chat messages."""
    call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": output},
        {"role": "assistant", "content": answer},
    ]


def python_demonstration(
    tokenizer: Any, prompt: str, answer: str, program: str, tools: Sequence[Tool]
) -> dict[str, Any]:
    """The ideal episode for a task with a reference ``program`` that prints its answer: run the
    program with the ``python`` tool, read what it printed (``answer`` and the newline ``print``
    adds: the tool returns stdout as it is), answer with it."""
    return render_demonstration(
        tokenizer, _tool_episode(prompt, "python", {"code": program}, answer + "\n", answer), tools
    )


def calculator_demonstration(tokenizer: Any, prompt: str, answer: str, tools: Sequence[Tool]) -> dict[str, Any]:
    """The ideal episode for an arithmetic prompt like ``"07+12="``: call the
    calculator on the expression, then answer with its result."""
    expression = prompt.strip().rstrip("=").strip()
    messages = _tool_episode(prompt, "calculator", {"expression": expression}, answer, answer)
    return render_demonstration(tokenizer, messages, tools)
