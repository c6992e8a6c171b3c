"""The PPO critic: a causal LM's backbone (:func:`slime.models.lean_lm.load_causal_lm`) plus a scalar value head.

``ValueModel(input_ids, attention_mask) -> [B, T]`` float32 values, the value after reading tokens
``0..t``. Values go through ``slime.rl.losses.critic_values``, never divided by the sampling
temperature (slime's W22 fix; ``tests/unit/test_torch_backend.py`` checks it). Saved as a torch
state dict with the backend's checkpoints; initialised from ``model.critic_path`` (the policy by
default) with a zero value head, so the first values are 0 and the first GAE advantages equal the
discounted returns.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from slime.rl.losses import critic_values

__all__ = ["ValueModel"]


class ValueModel(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: torch.dtype = torch.float32) -> ValueModel:
        from slime.models.lean_lm import load_causal_lm

        lm = load_causal_lm(path, dtype=dtype)
        # base_model is the decoder stack without the LM head (the lean Backbone, or HF's Qwen2Model, ...).
        model = cls(lm.base_model, int(lm.config.hidden_size))
        model.config = lm.config
        return model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return critic_values(self.value_head(hidden.to(self.value_head.weight.dtype)))
