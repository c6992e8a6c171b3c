"""What a spec's GPU engines would be started with: the previews ``render`` / ``--dry-run`` print.

The megatron-core arguments of the trainer ranks (``slime.backends.megatron.render``) and the
SGLang engine commands (``slime.backends.sglang.launch``), from the same pure functions the
runtime calls, so a preview cannot drift from what runs. A new backend with a preview adds its
line to :func:`engine_previews`.

Guaranteed: imports neither torch, megatron-core nor SGLang, at import or call time (render
works on a laptop; tests/unit/test_imports.py runs it in a fresh interpreter). Node addresses
are placeholders: the runtime fills them in.
"""

from __future__ import annotations

from slime.spec import LoadedSpec

__all__ = ["engine_previews"]


def engine_previews(loaded: LoadedSpec) -> dict[str, str]:
    """``{title: text}`` for each GPU engine of the spec (of sweep task 0 for a sweep); empty for CPU backends."""
    spec = loaded.tasks[0].spec if loaded.tasks and loaded.tasks[0].spec is not None else loaded.spec
    task = " (sweep task 0)" if loaded.is_sweep else ""
    out = {}
    if spec.train.backend == "megatron":
        from slime.backends.megatron.render import render_megatron_args

        out[f"megatron-core arguments of the trainer ranks{task}"] = render_megatron_args(spec)
    if spec.rollout.backend == "sglang":
        from slime.backends.sglang.launch import render_engine_commands

        out[f"SGLang engine commands{task}; node addresses are filled in at run time"] = render_engine_commands(spec)
    return out
