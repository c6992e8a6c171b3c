"""The SGLang rollout backend (``rollout.backend: sglang``).

``launch`` builds the exact server/router commands, ``process`` runs and stops
engine processes with bounded, health-checked startup, ``weights`` syncs new
weights (disk, NCCL, delta over disk) and ``delta`` is the delta format. SGLang
itself is never imported: engines are separate processes reached over HTTP.
What was and was not run against real SGLang: ``README.md`` in this directory.
"""
