"""The router load-balancing loss of a MoE model, as a training metric (``moe_load_balancing_loss``).

megatron-core computes it only when training on it; a forward hook on every ``TopKRouter``
recomputes the router logits (no gradient) and applies megatron's own functions with coefficient 1
(1.0 when tokens spread evenly, up to E when all go to the same experts). Reported: the mean over
MoE layers and this step's training micro-batches, averaged over ranks, over padded positions as
megatron's aux loss sees them. Eval forwards are not counted.
"""

from __future__ import annotations

import torch

__all__ = ["LoadBalancingMeter"]


class LoadBalancingMeter:
    """Hooks the routers of ``model`` (one pipeline stage: it may have none, and still takes part in ``take``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        self._sum = 0.0
        self._count = 0
        self.paused = False  # set by the backend around padding micro-batches
        self._routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
        for router in self._routers:
            router.register_forward_hook(self._hook)

    def _hook(self, router, inputs, _output) -> None:
        if not router.training or self.paused:
            return
        from megatron.core.transformer.moe.moe_utils import (
            compute_routing_scores_for_aux_loss,
            switch_load_balancing_loss_func,
        )

        with torch.no_grad():
            hidden = inputs[0].reshape(-1, inputs[0].shape[-1])
            logits = torch.nn.functional.linear(hidden.float(), router.weight.float())
            routing_map, scores = compute_routing_scores_for_aux_loss(
                logits, router.topk, router.config.moe_router_score_function
            )
            loss = switch_load_balancing_loss_func(
                probs=scores,
                tokens_per_expert=routing_map.sum(dim=0),
                total_num_tokens=hidden.shape[0],
                topk=router.topk,
                num_experts=router.config.num_moe_experts,
                moe_aux_loss_coeff=1.0,
            )
        self._sum += float(loss)
        self._count += 1

    def take(self, device: torch.device) -> float | None:
        """This step's mean over layers, micro-batches and all ranks (a collective: call on every rank)."""
        import torch.distributed as dist

        totals = torch.tensor([self._sum, float(self._count)], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        self._sum, self._count = 0.0, 0
        return float(totals[0] / totals[1]) if totals[1] > 0 else None
