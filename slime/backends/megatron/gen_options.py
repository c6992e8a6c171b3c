"""Write ``options.json``: the option names ``train.megatron.args`` may take, from the installed megatron-core.

Run with the pinned megatron-core installed (``python -m slime.backends.megatron.gen_options``); the spec's
rules read the JSON (plain data), so ``validate`` needs neither torch nor megatron-core. The names are the
dataclass fields of ``TransformerConfig`` and ``MLATransformerConfig`` (with their parent
``ModelParallelConfig``) that the constructor takes, plus the keys ``config.py`` consumes itself.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("options.json")


def options() -> dict:
    """{"megatron_core": version, "options": sorted names} from the megatron-core this Python imports."""
    import megatron.core
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    from slime.backends.megatron.config import _OWN_ARGS

    # init fields only; a leading underscore marks megatron-core's internal state (_cpu_offloading_context)
    names = {
        f.name
        for cls in (TransformerConfig, MLATransformerConfig)
        for f in dataclasses.fields(cls)
        if f.init and not f.name.startswith("_")
    }
    return {"megatron_core": megatron.core.__version__, "options": sorted(names | set(_OWN_ARGS))}


def main() -> int:
    OUT.write_text(json.dumps(options(), indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
