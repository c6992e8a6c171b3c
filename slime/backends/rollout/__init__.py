"""Rollout engines and the one HTTP client that drives them.

* :mod:`slime.backends.rollout.client` - ``EngineClient``, async, for SGLang and
  the built-in engine alike (imports aiohttp only, no torch).
* :mod:`slime.backends.rollout.builtin` - the built-in engine: an HTTP server
  speaking SGLang's native API subset over a lean PyTorch decoder.

Nothing is imported here, so importing this package stays cheap.
"""
