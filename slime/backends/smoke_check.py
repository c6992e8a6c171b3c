"""The smoke's engine check: the user's Megatron path, on a tiny model of their family, over gloo on CPU.

``python -m slime.backends.smoke_check REQUEST.json`` (written by ``slime.cli.smoke_engine``)
builds the tiny model (:mod:`slime.models.tiny_family`), samples a batch from it, starts the request's
ranks (:mod:`slime.backends.megatron.smoke_rank`: HF -> Megatron conversion, forward/backward, the optimizer step,
the weight export) and loads the export into the engine's model; it writes ``engine-check.json`` with
one verdict per stage, each from what was measured. The reward of the train step is synthetic and
labelled (a random-weight model earns no signal from a real one; an SFT job trains its SFT loss).
SGLang is not run: the engine reload uses the built-in engine's weight loader on the family's HF model.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["STAGES", "StageFailed", "check_export", "engine_reload", "main", "parallel_layout"]

STAGES = (
    "tiny model (your family)",
    "parallel layout",
    "HF -> Megatron conversion",
    "train step (your engine)",
    "weight export",
    "engine reload",
)
TINY, LAYOUT, CONVERT, TRAIN, EXPORT, RELOAD = STAGES
PROMPTS, GROUP, NEW_TOKENS = 2, 4, 8  # two prompts, a group of four samples each
REWARD_LABEL = (
    "synthetic reward: random per-sample scores with variance in every group (a random-weight tiny model "
    "earns no signal from your reward); train step only"
)
SFT_LABEL = "your SFT loss (masked NLL) on the tiny model's own samples: an SFT job has no reward"


class StageFailed(Exception):
    """A stage's evidence is wrong: the message says what and, where known, the fix."""


# ----------------------------------------------------------------------------- stages run here
def parallel_layout(config: dict[str, Any], layout: dict[str, Any]) -> str:
    """Megatron's rules for the folded layout on the tiny model's shape (StageFailed with the findings)."""
    from slime.backends.megatron.model_check import MegatronConfigError, ModelShape, parallel_findings

    try:
        shape = ModelShape.from_hf_config(config)
    except MegatronConfigError:
        return _layout_text(layout) + " (the model's shape is checked at conversion)"
    p = layout["parallel"]
    findings = parallel_findings(
        shape,
        tp=p["tensor"],
        pp=p["pipeline"],
        cp=p["context"],
        ep=p["expert"],
        etp=p["expert_tensor"],
        sequence_parallel=p["sequence_parallel"],
        world_size=layout["world"],
    )
    if findings:
        raise StageFailed(
            "; ".join(f"{path}: {message}" for path, message, _ in findings)
            + f" (the tiny model: {_shape_text(shape)}; your layout folded to {_layout_text(layout)})"
        )
    return _layout_text(layout)


def _layout_text(layout: dict[str, Any]) -> str:
    kept = ", ".join(layout["kept"]) or "none > 1"
    folded = "; folded: " + ", ".join(layout["folded"]) if layout["folded"] else ""
    return f"{layout['world']} gloo rank(s); kept: {kept}{folded}"


def _shape_text(shape: Any) -> str:
    text = f"{shape.family}, {shape.num_layers} layers, hidden {shape.hidden_size}, heads {shape.num_attention_heads}"
    text += f"/{shape.num_query_groups} kv"
    if shape.moe:
        text += f", {shape.moe.num_experts} experts top-{shape.moe.topk}"
        text += ", shared experts" if shape.moe.shared_ffn_hidden_size else ""
    if shape.mla:
        text += f", MLA (q rank {shape.mla.q_lora_rank}, kv rank {shape.mla.kv_lora_rank})"
    return text + (", qk-norm" if shape.qk_layernorm else "") + (", tied embeddings" if shape.tie_embeddings else "")


def check_shape(config: dict[str, Any]) -> Any:
    """The model shape megatron builds (StageFailed with the converter's own problems)."""
    from slime.backends.megatron.model_check import MegatronConfigError, ModelShape

    try:
        return ModelShape.from_hf_config(config)
    except MegatronConfigError as exc:
        raise StageFailed("; ".join(exc.problems) + " (in the tiny model's config.json, scaled from yours)") from None


def check_export(model_dir: Path, export_dir: Path) -> str:
    """Every tensor of the model in the export, with its shape (StageFailed naming what differs)."""
    from slime.models.safetensors_files import safetensors_files

    want, got = _tensor_shapes(safetensors_files(model_dir)), _tensor_shapes(safetensors_files(export_dir))
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    wrong = sorted(n for n in want.keys() & got.keys() if want[n] != got[n])
    problems = [
        f"{what}: {', '.join(names[:4])}" + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        for what, names in (("missing", missing), ("unexpected", extra), ("wrong shape", wrong))
        if names
    ]
    if problems:
        raise StageFailed(f"the export in {export_dir} is not the model's tensors: " + "; ".join(problems))
    return f"{len(got)} HF tensors, every one of the model's, same shapes"


def _tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    out = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                out[name] = tuple(handle.get_slice(name).get_shape())
    return out


def engine_reload(model_dir: Path, export_dir: Path, batch: dict[str, Any], trainer_logp: Any, tol: float) -> str:
    """Load the export as an engine would; its log-probs must match the trainer's after the step."""
    model, how = _load_export(model_dir, export_dir)
    served = _hf_logp(model, batch["tokens"])
    diff = _max_diff(served, trainer_logp, batch["response_mask"])
    stale = _max_diff(served, batch["engine_logp"], batch["response_mask"])  # against the weights before the step
    if not (diff <= tol and diff < stale):
        raise StageFailed(
            f"the reloaded engine's log-probs differ from the trainer's after the step by {diff:.3g} and from "
            f"the weights before it by {stale:.3g} (need <= {tol} and closer to after): the export does not "
            "carry the trained weights"
        )
    return f"{how}; engine vs trainer log-probs after the step: max diff {diff:.1e} (vs before it: {stale:.1e})"


def _load_export(model_dir: Path, export_dir: Path) -> tuple[Any, str]:
    """The model with the export's weights: the built-in engine's strict loader for the dense families it
    serves; transformers' loader of the exported checkpoint (every tensor required) for the others."""
    import torch
    from transformers import AutoModelForCausalLM

    from slime.backends.rollout.builtin.decoder import SUPPORTED_MODEL_TYPES
    from slime.backends.rollout.builtin.weights import WeightLoadError, load_hf_weights

    model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    if model_type in SUPPORTED_MODEL_TYPES:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        try:
            n = load_hf_weights(model, export_dir)
        except WeightLoadError as exc:
            raise StageFailed(f"the engine refused the export: {exc}") from None
        return model, f"the built-in engine's weight loader took all {n} tensors"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32, output_loading_info=True)
    except (RuntimeError, OSError, ValueError) as exc:  # transformers' conversion of a partial expert set
        raise StageFailed(f"the export in {export_dir} does not load as a {model_type} checkpoint: {exc}") from None
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if problems:
        shown = "; ".join(f"{k.replace('_', ' ')}: {', '.join(sorted(map(str, v))[:4])}" for k, v in problems.items())
        raise StageFailed(f"the export in {export_dir} does not load as a {model_type} checkpoint: {shown}")
    return model.eval(), f"the exported {model_type} checkpoint loaded whole (the built-in engine serves dense models)"


def _hf_logp(model: Any, tokens: Any) -> Any:
    import torch

    from slime.rl.losses import logprobs_from_logits

    with torch.no_grad():
        return logprobs_from_logits(model(tokens).logits[:, :-1].float(), tokens[:, 1:], 1.0)


def _max_diff(a: Any, b: Any, mask: Any) -> float:
    return float(((a - b).abs() * mask).max())


# ----------------------------------------------------------------------------- the batch
def sample_batch(model_dir: Path, seed: int) -> dict[str, Any]:
    """Prompts in the family's chat markup, a group of samples each from the tiny model (the engine's
    log-probs kept), and the synthetic reward's group-normalised advantages."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    rows, prompt_lens = [], []
    for q in ("What is 2 + 3?", "Name a prime number.")[:PROMPTS]:
        ids = _prompt_ids(tok, q)
        for _ in range(GROUP):
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, -1]
            out = list(ids)
            for _ in range(NEW_TOKENS):  # plain sampling, one token at a time (no generate(): any family)
                with torch.no_grad():
                    logits = model(torch.tensor([out])).logits[0, -1]
                out.append(int(torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen)))
            rows.append(out)
            prompt_lens.append(len(ids))
    T = max(len(r) for r in rows)
    pad = tok.pad_token_id or 0
    tokens = torch.tensor([r + [pad] * (T - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    response = attention[:, 1:].clone()
    for i, n in enumerate(prompt_lens):
        response[i, : n - 1] = 0
    scores = torch.randn(PROMPTS, GROUP, generator=gen)
    adv = ((scores - scores.mean(1, keepdim=True)) / scores.std(1, keepdim=True)).flatten()
    engine_logp = _hf_logp(model, tokens)
    return dict(
        tokens=tokens,
        attention_mask=attention,
        response_mask=response.float(),
        advantages=adv[:, None].expand(-1, T - 1).clone(),
        engine_logp=engine_logp,
        rewards=scores.flatten(),
    )


def _prompt_ids(tok: Any, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    try:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception:  # noqa: BLE001 - a tokenizer without a chat template: the plain text
        ids = tok(question)["input_ids"]
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return [int(i) for i in ids][:48]


# ----------------------------------------------------------------------------- the ranks
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(
    request: Path, req: dict[str, Any], timeout: float
) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
    """Start the ranks and wait for them: (their records, None or (the stage a failed rank was in, why))."""
    out, world, port = Path(req["out"]), req["world"], _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    procs = []
    for r in range(world):
        log = open(out / f"rank{r}.log", "w")  # noqa: SIM115 - closed below, after the process ends
        cmd = [sys.executable, "-m", "slime.backends.megatron.smoke_rank", str(request), str(r), str(port)]
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p, _ in procs) and time.monotonic() < deadline:
        if any(p.returncode not in (None, 0) for p, _ in procs):
            break  # one rank failed: the others wait on it in a collective
        time.sleep(0.5)
    for p, log in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        log.close()
    records = [_json(out / f"rank{r}.json") or {"stage": STAGES[2]} for r in range(world)]
    failed = [r for r, (p, _) in enumerate(procs) if p.returncode != 0]
    if not failed:
        return records, None
    first = min(failed, key=lambda r: STAGES.index(records[r]["stage"]) if records[r]["stage"] in STAGES else 0)
    why = _last_error(out / f"rank{first}.log") or f"killed after {timeout:.0f} s"
    stage = records[first]["stage"] if records[first]["stage"] in STAGES else CONVERT
    return records, (stage, f"rank {first}: {why} (log: {out / f'rank{first}.log'})")


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _last_error(log: Path) -> str:
    """The exception line of a rank's traceback (its last line that names an error)."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln:
            return ln[:600]
    return lines[-1][:600] if lines else ""


# ----------------------------------------------------------------------------- verdicts from the records
def conversion_verdict(records: list[dict[str, Any]], tol: float) -> str:
    diff = max(r["conversion_diff"] for r in records)
    if not diff <= tol:
        raise StageFailed(
            f"Megatron's log-probs of the engine's samples differ from the HF model's by {diff:.3g} (> {tol}) "
            "before any update: the HF -> Megatron conversion mishandles this model"
        )
    return f"Megatron vs HF log-probs before training: max diff {diff:.1e} on {len(records)} rank(s)"


def train_verdict(records: list[dict[str, Any]], optimizer: str, label: str = REWARD_LABEL) -> str:
    """The step's evidence: a finite loss, a gradient, changed parameters on every rank, and moved log-probs
    (a change below the weights' precision in all but a few tensors moves none)."""
    r0 = records[0]
    changed = sum(r["params_changed"] for r in records)
    total = sum(r["params_total"] for r in records)
    moved = max(r["logp_moved"] for r in records)
    if not all(r["loss_finite"] for r in records):
        raise StageFailed(f"the loss is {r0['loss']!r}, not finite")
    if not all(r["params_changed"] > 0 for r in records) or not r0["grad_norm"] > 0 or not moved > 0:
        raise StageFailed(
            f"the step left the weights unchanged (grad norm {r0['grad_norm']:.3g}; {changed}/{total} parameter "
            f"tensors changed, {min(r['params_changed'] for r in records)} on some rank; log-probs moved by up to "
            f"{moved:.2g}): an update below the weights' precision (train.optimizer.lr) or a loss that does not "
            "reach them"
        )
    return (
        f"loss {r0['loss']:.3g}, grad norm {r0['grad_norm']:.3g}; {changed}/{total} parameter tensors "
        f"changed ({optimizer}); log-probs moved by up to {moved:.2g}; {label}"
    )


def trainer_logp(out: Path, records: list[dict[str, Any]], batch: dict[str, Any]) -> Any:
    """The trainer's log-probs after the step, every row (each data-parallel rank has its own rows)."""
    import torch

    full = torch.full_like(batch["engine_logp"], float("nan"))
    for r, rec in enumerate(records):
        full[rec["rows"]] = torch.load(out / f"rank{r}-logp.pt")
    return full


# ----------------------------------------------------------------------------- main
class _Check:
    """The stages in order; after the first failure the rest are "not reached"."""

    def __init__(self, request: Path) -> None:
        self.request, self.req = request, json.loads(request.read_text())
        self.out = Path(self.req["out"])
        self.tol = float(self.req["tolerance"])
        self.records: list[dict[str, Any]] = []
        self.failure: tuple[str, str] | None = None
        self.batch: dict[str, Any] = {}
        self.label = SFT_LABEL if self.req.get("spec", {}).get("kind") == "SFTJob" else REWARD_LABEL

    def _from_ranks(self, stage: str) -> None:
        if self.failure and self.failure[0] == stage:
            raise StageFailed(self.failure[1])

    def tiny(self) -> str:
        from slime.models.tiny_family import build_family_model

        info = build_family_model(
            self.req["config"], self.out / "model", tokenizer_sources=self.req["tokenizer_sources"], seed=0
        )
        self.config = json.loads((self.out / "model" / "config.json").read_text())
        return f"{_shape_or_type(self.config)}; {info['params']:,} parameters; tokenizer: {info['tokenizer']}"

    def layout(self) -> str:
        return parallel_layout(self.config, self.req["layout"])

    def convert(self) -> str:
        import torch

        check_shape(self.config)
        self.batch = sample_batch(self.out / "model", seed=0)
        torch.save(self.batch, self.out / "batch.pt")
        self.records, self.failure = run_ranks(self.request, self.req, float(self.req["timeout_s"]))
        self._from_ranks(CONVERT)
        return conversion_verdict(self.records, self.tol)

    def train(self) -> str:
        self._from_ranks(TRAIN)
        return train_verdict(self.records, self.req["optimizer"], self.label)

    def export(self) -> str:
        self._from_ranks(EXPORT)
        return check_export(self.out / "model", self.out / "export")

    def reload(self) -> str:
        logp = trainer_logp(self.out, self.records, self.batch)
        return engine_reload(self.out / "model", self.out / "export", self.batch, logp, self.tol)

    def run(self) -> list[dict[str, str]]:
        done: list[dict[str, str]] = []
        steps = (self.tiny, self.layout, self.convert, self.train, self.export, self.reload)
        for name, step in zip(STAGES, steps):
            if done and done[-1]["status"] != "passed":
                done.append({"stage": name, "status": "not reached", "detail": ""})
                continue
            try:
                done.append({"stage": name, "status": "passed", "detail": step()})
            except StageFailed as exc:
                done.append({"stage": name, "status": "failed", "detail": str(exc)})
            except Exception as exc:  # noqa: BLE001 - any error of a stage is that stage's failure, named
                done.append({"stage": name, "status": "failed", "detail": f"{type(exc).__name__}: {exc}"})
        return done


def _shape_or_type(config: dict[str, Any]) -> str:
    from slime.backends.megatron.model_check import MegatronConfigError, ModelShape

    try:
        return _shape_text(ModelShape.from_hf_config(config))
    except MegatronConfigError:
        return str(config.get("model_type"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slime.backends.smoke_check", description=__doc__.splitlines()[0])
    ap.add_argument("request", type=Path)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    check = _Check(args.request.resolve())
    stages = check.run()
    result = {"stages": stages, "seconds": round(time.monotonic() - t0, 1), "reward": check.label}
    (check.out / "engine-check.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(s["status"] == "passed" for s in stages) else 1


if __name__ == "__main__":
    sys.exit(main())
