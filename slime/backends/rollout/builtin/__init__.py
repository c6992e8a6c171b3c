"""The built-in rollout engine: a PyTorch decoder served over SGLang's native HTTP API.

Modules: ``decoder`` (fused forward + KV cache over HF weights), ``sampling``
(parameters and the batched sampler), ``weights`` (in-place weight loading),
``generator`` (the continuous-batching ``Engine``), ``server`` (aiohttp app,
``start_server`` and the ``python -m slime.backends.rollout.builtin.server`` CLI).
It exists because real SGLang cannot run on CPU-only CI machines; the rollout
client drives both the same way.
"""
