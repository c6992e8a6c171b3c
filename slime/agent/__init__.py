"""Agentic rollouts: sandboxes, API adapters, tools, trajectory merging and the default agent loop.

Import the submodules directly; this package imports nothing, so ``import slime.agent`` stays cheap:
``sandbox`` (where tool calls run: ``LocalSandbox``, ``E2BSandbox``), ``adapters`` (OpenAI /
Anthropic compatible servers in front of the engine), ``tools`` (``python``, ``calculator``),
``trajectory`` (a session's turns -> training samples), ``generate`` (the default agent loop).
"""
