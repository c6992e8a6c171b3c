"""On-policy distillation on the trainer ranks (``algorithm.opd``, type ``trainer``), without Ray.

A rank built as the runtime builds it loads a teacher beside the student; its teacher log-probs on the
sampled tokens match a direct Hugging Face forward of the teacher at the rollout temperature (to 1e-5,
fp32 on CPU), and its advantages are the same rank's without OPD lowered by kl_coef x (student -
teacher) on every trained token (padding and masked tool tokens untouched).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from slime.rl.opd import opd_advantages  # noqa: E402
from slime.runtime.trainer_group import TrainerRank  # noqa: E402
from slime.spec.sections import Opd  # noqa: E402
from tests.fixtures.tiny_models import SMALL  # noqa: E402
from tests.fixtures.torch_backend import make_spec, samples  # noqa: E402

TEMPERATURE, COEF = 0.7, 0.5


def _prepared(spec, student, teacher=None):
    rank = TrainerRank(spec, "actor", 0, 1, threads=torch.get_num_threads(), gpu_slot=False)
    rank.init("127.0.0.1", 0, str(student))
    if teacher is not None:
        rank.init_teacher(str(teacher))
    data = samples(6, seed=2)
    metrics, _ = rank.prepare(data, [1.0, 0.0, 0.5, -1.0, 2.0, 0.25])
    return rank.batch, metrics


def _direct_log_probs(model_dir, batch, temperature: float):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits[:, :-1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(-1, batch.tokens[:, 1:, None]).squeeze(-1)


def test_teacher_log_probs_match_a_direct_forward_and_lower_the_advantages(tiny_model):
    student, teacher = tiny_model(seed=3, **SMALL), tiny_model(seed=4, **SMALL)
    base = {"rollout": {"temperature": TEMPERATURE}}
    opd = make_spec(algorithm={"opd": Opd(teacher=str(teacher), kl_coef=COEF)}, **base)
    with_teacher, m = _prepared(opd, student, teacher)
    plain, m0 = _prepared(make_spec(**base), student)

    mask = with_teacher.response_mask.bool()
    direct = _direct_log_probs(teacher, with_teacher, TEMPERATURE)
    assert (with_teacher.teacher_log_probs - direct)[mask].abs().max() <= 1e-5
    assert not torch.allclose(with_teacher.teacher_log_probs[mask], with_teacher.old_log_probs[mask], atol=1e-2)

    kl = with_teacher.old_log_probs - with_teacher.teacher_log_probs
    expected = (plain.advantages - COEF * kl) * mask
    assert torch.allclose(with_teacher.advantages, expected, atol=1e-6)
    assert torch.equal(with_teacher.advantages[~mask], torch.zeros_like(with_teacher.advantages[~mask]))
    assert m["train/opd_kl"] == pytest.approx(float(kl[mask].mean()), rel=1e-5) and "train/opd_kl" not in m0


def test_opd_advantages_carry_no_gradient_and_keep_padding_zero():
    adv = torch.ones(2, 3)
    student = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.0, -3.0], [-0.5, -2.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out, kl = opd_advantages(adv, student, teacher, mask, 2.0)
    assert not out.requires_grad
    assert out.tolist() == [[0.0, 3.0, 1.0], [1.0, -3.0, 0.0]] and kl.tolist() == [[0.5, -1.0, 0.0], [0.0, 2.0, 0.0]]
