"""On-policy distillation (slime's ``--use-opd``): the teacher's opinion of each sampled token.

:func:`opd_advantages` lowers every trained token's advantage by ``kl_coef x (student - teacher)``
log-prob, the per-token reverse-KL estimate ``k1`` of the student from the teacher on the student's
own samples; it comes on top of any estimator's advantages (after their normalisation, as in slime)
and carries no gradient. Padding stays zero. Not here: where the teacher's log-probs come from.
"""

from __future__ import annotations

import torch

from slime.rl.kl import k1
from slime.rl.masked import check_same_shape, zero_masked

__all__ = ["opd_advantages"]


def opd_advantages(
    advantages: torch.Tensor, student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages with the penalty, per-token k1 zeroed at padding)``, all ``[B, T-1]``."""
    check_same_shape(student=student, teacher=teacher, mask=mask)
    kl = zero_masked(k1(student.detach(), teacher.detach()), mask)
    return zero_masked(advantages - kl_coef * kl, mask), kl
