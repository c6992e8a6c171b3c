"""Agentic rollouts: sandboxes, API adapters, tools, trajectory merging and the default agent loop.

Subpackages/modules (import them directly; this package imports nothing, so
``import slime.agent`` stays cheap):

- ``sandbox``     where tool calls execute (``LocalSandbox`` via bubblewrap, ``E2BSandbox``)
- ``adapters``    OpenAI / Anthropic compatible servers in front of the rollout engine
- ``tools``       the ``python`` and ``calculator`` tools (the ``TOOLS`` registry)
- ``trajectory``  a session's turns -> training samples
- ``generate``    the default agent loop as a generate plug-in
"""
