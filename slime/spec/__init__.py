"""The job spec: YAML → JSON Schema → frozen typed, resolved objects.

Imports nothing heavy (no torch, ray, transformers, megatron, sglang): the CLI's
validate/render paths and the launchers depend on that (tested).
"""

from slime.spec.errors import Origin, Problem, SpecError
from slime.spec.load import LoadedSpec, Task, load_spec, load_spec_text, parse_path
from slime.spec.types import API_VERSION, Spec

__all__ = [
    "API_VERSION",
    "LoadedSpec",
    "Origin",
    "Problem",
    "Spec",
    "SpecError",
    "Task",
    "load_spec",
    "load_spec_text",
    "parse_path",
]
