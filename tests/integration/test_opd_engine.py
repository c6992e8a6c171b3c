"""On-policy distillation from a teacher engine (``algorithm.opd.type: engine``), without Ray.

A built-in engine serves the teacher; the rollout's teacher request (``slime.runtime.rollout.teacher``, SGLang's
scoring form) gives each sample's response log-probs, which match a direct Hugging Face forward of the
teacher at the rollout temperature to 1e-5 (fp32, CPU) and the teacher forwarded on a trainer rank (type
trainer). A trainer rank with type engine loads no teacher and lowers the advantages by kl_coef x (student -
teacher) with those; samples without them are refused. The log-probs survive checkpoints and saved rollouts;
the layout puts the teacher on engine 0's slot; a teacher of another vocabulary is refused.
"""

from __future__ import annotations

import asyncio
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from slime.backends.rollout.builtin.server import start_server  # noqa: E402
from slime.backends.rollout.client import EngineClient  # noqa: E402
from slime.rl.sample import Sample  # noqa: E402
from slime.runtime.rollout.saved import read_rollout, write_rollout  # noqa: E402
from slime.runtime.rollout.teacher import ask_teacher  # noqa: E402
from slime.runtime.step_plan import train_inputs  # noqa: E402
from slime.runtime.trainer_group import TrainerRank  # noqa: E402
from slime.spec.layout import layout_table, plan_layout  # noqa: E402
from slime.spec.rules import opd_teacher  # noqa: E402
from slime.spec.sections import Opd  # noqa: E402
from tests.fixtures.tiny_models import SMALL  # noqa: E402
from tests.fixtures.torch_backend import make_spec, samples  # noqa: E402

pytestmark = pytest.mark.timeout(180)
TEMPERATURE, COEF = 0.7, 0.5
SCORES = [1.0, 0.0, 0.5, -1.0, 2.0, 0.25]


def _samples() -> list[Sample]:
    return [
        Sample(
            group_index=i // 2,
            index=i,
            tokens=d["tokens"],
            response_length=d["response_length"],
            loss_mask=d["loss_mask"],
        )
        for i, d in enumerate(samples(6, seed=2))
    ]


def _direct(model_dir, s: Sample) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([s.tokens])).logits[0, s.prompt_length - 1 : -1].float()
    return torch.log_softmax(logits / TEMPERATURE, -1).gather(1, torch.tensor(s.response_tokens)[:, None]).squeeze(1)


def _prepare(spec, student, data, teacher=None):
    rank = TrainerRank(spec, "actor", 0, 1, threads=torch.get_num_threads(), gpu_slot=False)
    rank.init("127.0.0.1", 0, str(student))
    if teacher is not None:
        rank.init_teacher(str(teacher))
    metrics, _ = rank.prepare(data, SCORES)
    return rank, metrics


@pytest.fixture(scope="module")
def models(tiny_model):
    return tiny_model(seed=3, **SMALL), tiny_model(seed=4, **SMALL)


@pytest.fixture(scope="module")
def scored(models):
    """The samples, scored by a built-in engine serving the teacher (what the rollout manager does)."""
    srv = start_server(models[1], host="127.0.0.1", port=0, seed=0)
    try:

        async def go(batch):
            async with EngineClient(srv.url, timeout_s=60) as c:
                await ask_teacher(c, batch, TEMPERATURE)

        batch = _samples()
        asyncio.run(go(batch))
        return batch
    finally:
        srv.stop()


def test_teacher_engine_log_probs_match_a_direct_forward_of_the_teacher(models, scored):
    worst = max((torch.tensor(s.teacher_log_probs) - _direct(models[1], s)).abs().max().item() for s in scored)
    assert worst <= 1e-5, worst
    assert all(len(s.teacher_log_probs) == s.response_length for s in scored)


def test_a_rank_of_type_engine_uses_the_engines_log_probs_and_loads_no_teacher(models, scored):
    student, teacher = models
    base = {"rollout": {"temperature": TEMPERATURE}}
    engine_spec = make_spec(algorithm={"opd": Opd(teacher=str(teacher), type="engine", kl_coef=COEF)}, **base)
    trainer_spec = make_spec(algorithm={"opd": Opd(teacher=str(teacher), kl_coef=COEF)}, **base)
    rank, m = _prepare(engine_spec, student, train_inputs(scored))
    on_rank, _ = _prepare(trainer_spec, student, train_inputs(scored), teacher)
    plain, _ = _prepare(make_spec(**base), student, train_inputs(scored))
    b, mask = rank.batch, rank.batch.response_mask.bool()
    assert rank.teacher is None
    # the engine's teacher log-probs are the trainer-forwarded teacher's, to fp32 rounding
    assert (b.teacher_log_probs - on_rank.batch.teacher_log_probs)[mask].abs().max() <= 1e-5
    kl = b.old_log_probs - b.teacher_log_probs
    assert torch.allclose(b.advantages, (plain.batch.advantages - COEF * kl) * mask, atol=1e-6)
    assert m["train/opd_kl"] == pytest.approx(float(kl[mask].mean()), rel=1e-5)
    with pytest.raises(ValueError, match="needs the teacher's log-probs, but these samples have none"):
        _prepare(engine_spec, student, train_inputs(_samples()))


def test_teacher_log_probs_survive_checkpoints_and_saved_rollouts(tmp_path, scored):
    s = scored[0]
    back = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s and back.teacher_log_probs == s.teacher_log_probs
    write_rollout(tmp_path, 3, scored)
    assert [x.teacher_log_probs for x in read_rollout(tmp_path, 3)] == [x.teacher_log_probs for x in scored]
    with pytest.raises(ValueError, match="teacher_log_probs"):
        Sample.from_dict({**s.to_dict(), "teacher_log_probs": ["x"]})
    bad = Sample.from_dict({**s.to_dict(), "teacher_log_probs": [0.0] * (s.response_length + 1)})
    with pytest.raises(ValueError, match="teacher_log_probs has"):
        bad.check_lengths()


def test_the_layout_puts_the_teacher_engine_on_engine_0s_slot(models):
    spec = make_spec(algorithm={"opd": Opd(teacher=str(models[1]), type="engine")})
    layout = plan_layout(spec)
    assert layout.teacher == layout.engines[0] and "teacher" in layout.roles_of(layout.teacher[0])
    assert any(row.startswith("teacher") for row in layout_table(layout))
    assert plan_layout(make_spec(algorithm={"opd": Opd(teacher=str(models[1]))})).teacher == ()


def test_a_teacher_of_another_vocabulary_is_refused(tmp_path):
    dirs = []
    for name, vocab in (("student", 261), ("teacher", 300)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"vocab_size": vocab}))
        dirs.append(str(tmp_path / name))
    spec = make_spec(model={"path": dirs[0], "builtin": None}, algorithm={"opd": Opd(teacher=dirs[1], type="engine")})
    (finding,) = list(opd_teacher(spec))
    assert finding[0] == "algorithm.opd.teacher" and "300 tokens, the student's (model.path) 261" in finding[1]
    same = make_spec(model={"path": dirs[0], "builtin": None}, algorithm={"opd": Opd(teacher=dirs[0], type="engine")})
    assert list(opd_teacher(same)) == []
