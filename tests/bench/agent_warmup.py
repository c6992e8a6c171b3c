"""When does the agent spec's SFT warm-up learn its two copies? A learning diagnostic, not a speed test.

Run by hand:  python tests/bench/agent_warmup.py [--seeds 1,2,3,4] [--steps 600] [--every 50]
              [--set algorithm.sft_warmup_lr=1e-3 ...] [--heads 8 --kv-heads 8] [--compact-calls]

``specs/agent-local.yaml``'s warm-up (the same demonstrations, optimizer and learning rate the
runtime uses, in one process) for each seed; every ``--every`` steps it scores 64 held-out
demonstrations teacher-forced by argmax: the expression copied into the tool call, the tool's
result copied into the answer, and every model token right (a greedy episode would then succeed).
The README's figures on when the copies appear come from this script. Seeds run one after another
with one thread each; about 0.3 s a step on this project's 2-core machine.

Experiments: ``--heads/--kv-heads/--hidden/--layers`` train a model of another shape than the built-in
``tiny`` (same tokenizer and template); ``--init-std`` another initial scale (default: the spec's
``model.builtin``; ``tiny-agent`` is 1/sqrt(128) = 0.088, ``tiny`` 0.02); ``--compact-calls`` renders the
calculator call as ``<tool_call>calculator(07+12)</tool_call>`` instead of the JSON body (the expression then sits ~40
tokens after the prompt's instead of ~80). That rendering exists only here: the adapters parse the
JSON form.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import transformers  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from slime.agent.demos import agent_sft_sample  # noqa: E402
from slime.backends.base import RankInfo  # noqa: E402
from slime.backends.train.torch_backend import TorchTrainBackend  # noqa: E402
from slime.models.tiny import BUILTIN_BUILDS, build_tiny_model  # noqa: E402
from slime.runtime.train_data import collate  # noqa: E402
from slime.spec import load_spec  # noqa: E402

ASSISTANT = "<|im_start|>assistant\n"
EXPRESSION = '"expression": "'
COMPACT_EXPRESSION = "<tool_call>calculator("
# The tiny template's JSON tool call, and the compact one --compact-calls puts in its place (the
# arguments arrive as the JSON string '{"expression": "..."}': the slice keeps the expression).
JSON_CALL = (
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
)
COMPACT_CALL = "{{- '<tool_call>' + fn['name'] + '(' + fn['arguments'][16:-2] + ')</tool_call>' }}"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (REPO / "specs/data/arith" / name).read_text().splitlines()]


def score(model, tok, demos: list[tuple[dict, dict]], marker: str = EXPRESSION) -> dict[str, float]:
    """Fractions of demonstrations whose expression copy, answer copy, and every model token are argmax-right."""
    hits = {"expression": 0, "answer": 0, "episode": 0}
    model.eval()
    with torch.no_grad():
        for demo, row in demos:
            tokens = demo["tokens"]
            pred = model(input_ids=torch.tensor([tokens])).logits[0].argmax(-1).tolist()
            right = [pred[i - 1] == tokens[i] for i in range(len(tokens))]  # right[i]: token i predicted
            start = len(tokens) - demo["response_length"]
            hits["episode"] += all(right[start + i] for i, m in enumerate(demo["loss_mask"]) if m)
            text = tok.decode(tokens)

            def span(char_at: int, n: int) -> bool:
                at = len(tok.encode(text[:char_at], add_special_tokens=False))  # noqa: B023
                return all(right[at : at + n])  # noqa: B023

            expression = row["prompt"].strip().rstrip("=")
            hits["expression"] += span(text.index(marker) + len(marker), len(expression))
            hits["answer"] += span(text.rindex(ASSISTANT) + len(ASSISTANT), len(row["label"]))
    model.train()
    return {k: v / len(demos) for k, v in hits.items()}


def run_seed(seed: int, args, model_dir: Path, tok, table: Table) -> None:
    spec = load_spec(
        REPO / "specs/agent-local.yaml", overrides=[f"train.seed={seed}", *args.overrides], check_paths=True
    ).spec
    torch.manual_seed(seed)
    actor = TorchTrainBackend()
    actor.init(
        spec,
        RankInfo(rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, device="cpu"),
        model_dir,
        role="actor",
    )
    held = rows("heldout.jsonl")[:64]
    demos = [(agent_sft_sample(spec, tok, r["prompt"], r["label"]), r) for r in held]
    train, rng, t = rows("train.jsonl"), random.Random(seed), time.monotonic()
    for step in range(1, args.steps + 1):
        batch = [
            agent_sft_sample(spec, tok, r["prompt"], r["label"])
            for r in rng.sample(train, spec.train.global_batch_size)
        ]
        loss = actor.train_step(collate(batch, kind="sft", pad_id=tok.pad_token_id), step=step - 1)["sft_loss"]
        if step % args.every == 0:
            s = score(actor.model, tok, demos, COMPACT_EXPRESSION if args.compact_calls else EXPRESSION)
            table.add_row(
                str(seed),
                str(step),
                f"{loss:.3f}",
                f"{s['expression']:.2f}",
                f"{s['answer']:.2f}",
                f"{s['episode']:.2f}",
                f"{time.monotonic() - t:.0f}",
            )
            print(
                f"seed {seed} step {step}: loss {loss:.3f} expression {s['expression']:.2f} "
                f"answer {s['answer']:.2f} episode {s['episode']:.2f}",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3,4")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--hidden", type=int, default=128, help="model shape (the built-in tiny: 128/4/4/2)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument(
        "--init-std", type=float, default=None, help="initialiser std (default: the spec's built-in model's)"
    )
    ap.add_argument("--compact-calls", action="store_true", help="calculator(07+12) instead of the JSON call")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="a spec override, e.g. algorithm.sft_warmup_lr=1e-3",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    table = Table(
        "seed",
        "step",
        "sft loss",
        "expression",
        "answer",
        "episode",
        "s",
        title="agent warm-up: held-out teacher-forced copy accuracy",
    )
    with tempfile.TemporaryDirectory() as tmp:
        # The defaults build exactly the spec's built-in model (ensure_builtin_model builds it the same way).
        builtin = load_spec(REPO / "specs/agent-local.yaml", overrides=args.overrides).spec.model.builtin
        build = dict(BUILTIN_BUILDS[builtin or "tiny"], hidden=args.hidden, layers=args.layers, heads=args.heads)
        build.update(kv_heads=args.kv_heads, **({} if args.init_std is None else {"init_std": args.init_std}))
        model_dir = build_tiny_model(Path(tmp) / "model", **build)
        tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        if args.compact_calls:
            if JSON_CALL not in tok.chat_template:
                raise SystemExit("the tiny template's tool call changed: update JSON_CALL")
            tok.chat_template = tok.chat_template.replace(JSON_CALL, COMPACT_CALL)
        for seed in (int(s) for s in args.seeds.split(",")):
            run_seed(seed, args, model_dir, tok, table)
    Console().print(table)


if __name__ == "__main__":
    main()
