"""A tiny random model of the user's own family: their ``config.json`` with the sizes scaled down.

:func:`scale_config` keeps the architecture's features (model type, GQA ratio, qk-norm, MoE top-k,
shared experts, MLA ranks present or absent, tied embeddings, RoPE settings) and shrinks layers,
widths, heads, experts and the vocabulary consistently; :func:`build_family_model` writes it as an
HF checkpoint (transformers' own classes, seeded random weights) with the user's tokenizer when it
loads from local files, else the built-in one with the family's chat template. Not guaranteed: that
a config with keys transformers does not know builds (its error is passed on).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["LAYERS", "build_family_model", "family_chat_template", "scale_config"]

LAYERS = 4  # two pipeline stages of two layers: a dense and an MoE layer each where the family has both
HIDDEN, HEAD_DIM, FFN, MOE_FFN, MAX_EXPERTS, MAX_TOPK = 64, 16, 128, 32, 8, 2
_MLA = {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
_DROPPED = ("quantization_config", "auto_map", "_name_or_path", "architectures")


def _heads(cfg: dict[str, Any]) -> tuple[int, int]:
    """(query heads, key/value heads) keeping grouped-query attention (and its ratio, up to 4) or MHA."""
    heads = int(cfg.get("num_attention_heads") or 4)
    kv = int(cfg.get("num_key_value_heads") or heads)
    ratio = max(1, heads // max(kv, 1))
    kv_t = 1 if kv == 1 else 2 if ratio > 1 else 4
    return kv_t * min(ratio, 4), kv_t


def _moe(cfg: dict[str, Any], out: dict[str, Any]) -> None:
    key = "n_routed_experts" if "n_routed_experts" in cfg else "num_experts"
    experts = cfg.get(key)
    if not experts:
        return
    out[key] = min(int(experts), MAX_EXPERTS)
    if cfg.get("num_experts_per_tok"):
        out["num_experts_per_tok"] = min(int(cfg["num_experts_per_tok"]), MAX_TOPK)
    for k in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if cfg.get(k):
            out[k] = MOE_FFN if k == "moe_intermediate_size" else 2 * MOE_FFN
    if cfg.get("n_shared_experts"):
        out["n_shared_experts"] = 1
    if cfg.get("n_group"):  # DeepSeek's group-limited routing: a group scored by its top 2 (both libraries)
        out["n_group"] = max(1, out[key] // 2)
        per_group = max(1, int(cfg.get("num_experts_per_tok") or 2) // int(cfg.get("topk_group") or 1))
        out["topk_group"] = max(1, min(out.get("num_experts_per_tok", 2) // per_group, out["n_group"]))
    if "first_k_dense_replace" in cfg:
        out["first_k_dense_replace"] = min(int(cfg["first_k_dense_replace"]), 1)
    if "mlp_only_layers" in cfg:
        out["mlp_only_layers"] = [i for i in cfg["mlp_only_layers"] or [] if i < LAYERS]
    if cfg.get("decoder_sparse_step"):
        out["decoder_sparse_step"] = min(int(cfg["decoder_sparse_step"]), 2)


def scale_config(cfg: dict[str, Any], *, vocab_size: int) -> dict[str, Any]:
    """``cfg`` (an HF config.json dict) with its sizes scaled down and its features kept (module doc)."""
    layers = int(cfg.get("num_hidden_layers") or LAYERS)
    out = {k: v for k, v in cfg.items() if k not in _DROPPED}
    for k, v in cfg.items():  # per-layer lists (layer_types and the like) keep their first layers
        if isinstance(v, list) and len(v) == layers and k != "mlp_only_layers":
            out[k] = v[:LAYERS]
    heads, kv = _heads(cfg)
    out.update(
        num_hidden_layers=LAYERS,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        vocab_size=vocab_size,
        torch_dtype="float32",
    )
    if "head_dim" in cfg:
        out["head_dim"] = HEAD_DIM
    if "max_window_layers" in cfg:
        out["max_window_layers"] = min(int(cfg["max_window_layers"] or 0), LAYERS)
    if "num_nextn_predict_layers" in cfg:  # multi-token prediction is neither built nor trained
        out["num_nextn_predict_layers"] = 0
    for k, v in _MLA.items():
        if k in cfg:
            out[k] = None if cfg[k] is None else v
    if "kv_lora_rank" in cfg:
        out["num_key_value_heads"] = heads  # MLA: one latent shared by every head
    _moe(cfg, out)
    return out


_TEMPLATES = {
    "llama": (
        "{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] "
        "+ '<|eot_id|>' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
    ),
    "deepseek_v3": (
        "{%- for m in messages %}{%- if m['role'] == 'user' %}{{- '<｜User｜>' + m['content'] }}"
        "{%- elif m['role'] == 'assistant' %}{{- '<｜Assistant｜>' + m['content'] + '<｜end▁of▁sentence｜>' }}"
        "{%- else %}{{- m['content'] }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<｜Assistant｜>' }}{%- endif %}"
    ),
}


def family_chat_template(model_type: str) -> str:
    """The chat markup of the family (Qwen's ChatML for the Qwen families), for the built-in tokenizer."""
    from slime.models.tiny import CHAT_TEMPLATE

    return _TEMPLATES.get(model_type, CHAT_TEMPLATE)


def _tokenizer(sources: list[str], model_type: str) -> tuple[Any, str]:
    """(tokenizer, where from): the first of ``sources`` that loads from local files, else the built-in one."""
    from transformers import AutoTokenizer

    for src in sources:
        if not any((Path(src) / f).is_file() for f in _TOKENIZER_FILES):
            continue
        try:
            return AutoTokenizer.from_pretrained(src, local_files_only=True), f"yours ({src})"
        except Exception:  # noqa: BLE001 - any unreadable tokenizer falls back to the built-in one
            continue
    from slime.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = family_chat_template(model_type)
    return tok, f"built-in, with the {model_type} chat template (your tokenizer files are not readable here)"


def build_family_model(
    config: dict[str, Any], out_dir: str | Path, *, tokenizer_sources: list[str] = (), seed: int = 0
) -> dict[str, Any]:
    """Write the tiny model of ``config``'s family to ``out_dir``; return what was built (for the report)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_type = str(config.get("model_type"))
    tok, tok_from = _tokenizer(list(tokenizer_sources), model_type)
    scaled = scale_config(config, vocab_size=len(tok))
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        scaled[k] = getattr(tok, k, None)
    hf_cfg = AutoConfig.for_model(**{k: v for k, v in scaled.items() if k != "transformers_version"})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
        with torch.no_grad():  # HF starts norms at 1, biases and routers at 0: draw them so a swap shows
            for name, t in model.named_parameters():
                if "norm" in name:
                    t.add_(0.1 * torch.randn_like(t))
                elif name.endswith(("bias", "gate.weight")):
                    t.copy_(0.5 * torch.randn_like(t))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    info = {"model_type": model_type, "params": params, "tokenizer": tok_from, "config": scaled}
    (out / "tiny_family.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
    return info
