"""What a spec's engines would be started with: the previews ``render`` / ``--dry-run`` print.

Each selected plug-in with a ``preview`` hook (``slime.spec.plugin``) renders its own, from the
same pure functions its runtime calls, so a preview cannot drift from what runs. Guaranteed:
imports neither torch, megatron-core nor SGLang (render works on a laptop; tests/unit/test_imports.py
runs it in a fresh interpreter). Node addresses are placeholders: the runtime fills them in.
"""

from __future__ import annotations

from slime.spec import LoadedSpec
from slime.spec.plugin import KINDS, hook, selected

__all__ = ["engine_previews"]


def engine_previews(loaded: LoadedSpec) -> dict[str, str]:
    """``{title: text}`` for each selected plug-in that previews (of sweep task 0 for a sweep)."""
    spec = loaded.tasks[0].spec if loaded.tasks and loaded.tasks[0].spec is not None else loaded.spec
    task = " (sweep task 0)" if loaded.is_sweep else ""
    out = {}
    for kind in KINDS:
        preview = hook(selected(spec, kind), "preview")
        if preview is not None:
            title, text = preview(spec)
            out[title.replace(";", f"{task};", 1) if ";" in title else title + task] = text
    return out
