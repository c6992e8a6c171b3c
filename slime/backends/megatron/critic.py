"""The PPO critic on megatron-core: a GPTModel whose output layer is a scalar value head.

Starts from ``model.critic_path``; the value head (absent from HF checkpoints) starts at zero, so
nothing random leaks into early advantages. The head is replicated across TP ranks and reads the
final-norm hidden states (gathering the sequence under sequence parallelism). Output ``[b, s, 1]``,
never divided by the sampling temperature. Imports megatron-core; megatron backend only.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule

__all__ = ["ValueHead"]


class ValueHead(MegatronModule):
    """Drop-in for ``GPTModel.output_layer``: ``(hidden [s, b, h]) -> ([s, b, 1], None)``."""

    def __init__(self, config) -> None:
        super().__init__(config=config)
        self.weight = torch.nn.Parameter(torch.zeros(1, config.hidden_size, dtype=config.params_dtype))
        self.sequence_parallel = config.sequence_parallel

    def forward(self, hidden: torch.Tensor, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:
            from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden, self.weight), None
