"""Agent-facing API servers (OpenAI chat completions, Anthropic messages) over a rollout engine.

``start_adapter("openai", engine_url, tokenizer, max_turns=4)`` starts an
:class:`AdapterServer`; ``open_session()`` gives a token the agent uses as its
API key; ``close_session(id)`` drains the session and returns its trajectory
tree (see ``server``, ``sessions`` and ``toolcalls`` for the contracts).
Protocols are looked up by name in ``PROTOCOLS`` (``agent.adapter`` in a spec).
"""

from __future__ import annotations

from slime.agent.adapters.server import AdapterServer, ChatRequest, Generation, start_adapter
from slime.agent.adapters.sessions import (
    AdapterError,
    SessionClosed,
    SessionRegistry,
    SessionResult,
    TurnLimitExceeded,
    TurnRecord,
    UnknownSession,
)
from slime.agent.adapters.toolcalls import InvalidToolCall, ToolCall, format_tool_call, parse_tool_calls
from slime.core.registry import Registry

__all__ = [
    "PROTOCOLS",
    "AdapterError",
    "AdapterServer",
    "ChatRequest",
    "Generation",
    "InvalidToolCall",
    "SessionClosed",
    "SessionRegistry",
    "SessionResult",
    "ToolCall",
    "TurnLimitExceeded",
    "TurnRecord",
    "UnknownSession",
    "format_tool_call",
    "parse_tool_calls",
    "start_adapter",
]

PROTOCOLS = Registry(
    "agent adapter protocol",
    {
        "openai": "slime.agent.adapters.openai:OpenAIProtocol",
        "anthropic": "slime.agent.adapters.anthropic:AnthropicProtocol",
    },
)
