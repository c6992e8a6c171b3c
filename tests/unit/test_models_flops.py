"""Model FLOPs (``slime.models.flops``) against hand-computed counts: a Qwen2-shaped dense model, MoE configs
(Qwen3-MoE, Qwen2-MoE with a shared expert and dense layers), an MLA config, and the 6·N·T identity checked
against the matmul parameters of a real HF model."""

from __future__ import annotations

import pytest

from slime.models.flops import TRAIN_PASSES, forward_flops, model_shape

QWEN25_05B = {  # Qwen2.5-0.5B's config.json (the fields that matter)
    "model_type": "qwen2",
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}

QWEN3_30B_A3B = {  # Qwen3-30B-A3B: head_dim 128 with 32 heads, so H·d = 4096 != hidden 2048
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
}


def test_qwen2_dense_by_hand():
    # s = 1024, h 896, H 14, G 2, d 64, f 4864, V 151936, 24 layers; per layer:
    #   qkv   2·1024·896·64·(14+4)  = 2,113,929,216
    #   out   2·1024·(14·64)·896    = 1,644,167,168
    #   attn  2·1024²·14·64 (causal) = 1,879,048,192
    #   mlp   6·1024·896·4864       = 26,776,436,736
    #   layer = 32,413,581,312; × 24 = 777,925,951,488
    # LM head 2·1024·896·151936 = 278,803,775,488   -> forward 1,056,729,726,976
    m = model_shape(QWEN25_05B)
    assert m is not None and m.head_dim == 64 and m.moe_layers == 0 and m.mla is None
    assert forward_flops(m, [1024]) == 1_056_729_726_976
    # sequences are separate causal sequences: two of 512 are not one of 1024 (attention is per sequence)
    # each 512: per layer 2,113,929,216/2 + 1,644,167,168/2 + 1,879,048,192/4 + 26,776,436,736/2
    #   = 1,056,964,608 + 822,083,584 + 469,762,048 + 13,388,218,368 = 15,737,028,608; × 24 = 377,688,686,592
    #   + LM head 139,401,887,744 = 517,090,574,336; two of them: 1,034,181,148,672
    assert forward_flops(m, [512, 512]) == 1_034_181_148_672


def test_qwen3_moe_by_hand():
    # s = 2048, h 2048, H 32, G 4, d 128 (H·d 4096), 128 experts of 768, top-8, every layer MoE:
    #   qkv   2·2048·2048·128·(32+8) = 42,949,672,960
    #   out   2·2048·4096·2048      = 34,359,738,368
    #   attn  2·2048²·32·128        = 34,359,738,368
    #   mlp   6·2048·2048·(8·768)   = 154,618,822,656
    #   router 2·2048·2048·128      = 1,073,741,824
    #   layer = 267,361,714,176; × 48 = 12,833,362,280,448
    # LM head 2·2048·2048·151936 = 1,274,531,545,088 -> forward 14,107,893,825,536
    m = model_shape(QWEN3_30B_A3B)
    assert m is not None and (m.moe_layers, m.experts, m.topk, m.moe_ffn, m.shared_ffn) == (48, 128, 8, 768, 0)
    assert forward_flops(m, [2048]) == 14_107_893_825_536


def test_qwen2_moe_shared_expert_and_dense_layers_by_hand():
    # 4 layers, decoder_sparse_step 2 -> layers 1 and 3 are MoE, mlp_only_layers [3] -> only layer 1.
    # h 64, H 4, G 2, d 16, dense f 128, 8 experts of 32, top-2, shared expert 96; V 100; s = 10:
    #   attention per layer: qkv 2·10·64·16·8 = 163,840; out 2·10·64·64 = 81,920; attn 2·100·4·16 = 12,800
    #     -> 258,560 × 4 layers = 1,034,240
    #   dense MLP (3 layers): 6·10·64·128 = 491,520 each -> 1,474,560
    #   MoE MLP (1 layer): 6·10·64·(2·32 + 96) = 614,400 + router 2·10·64·8 = 10,240 -> 624,640
    #   LM head 2·10·64·100 = 128,000
    # forward = 1,034,240 + 1,474,560 + 624,640 + 128,000 = 3,261,440
    cfg = {
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 96,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "vocab_size": 100,
    }
    m = model_shape(cfg)
    assert m is not None and m.moe_layers == 1 and m.shared_ffn == 96
    assert forward_flops(m, [10]) == 3_261_440


def test_mla_only_when_kv_lora_rank_is_set():
    # DeepSeek-shaped, 2 layers (first_k_dense_replace 1 -> layer 1 MoE), h 64, H 4, q_lora 32, kv_lora 16,
    # d_nope 8, d_rope 4, d_v 8; s = 10; dense f 96; 4 routed experts of 16, top-2, 1 shared (16); V 50:
    #   q   2·10·(64·32 + 32·4·12) = 2·10·(2048 + 1536) = 71,680
    #   kv  2·10·(64·(16+4) + 16·4·(8+8)) = 2·10·(1280 + 1024) = 46,080
    #   out 2·10·4·8·64 = 40,960; attn 100·4·(12 + 8) = 8,000 -> 166,720 per layer, × 2 = 333,440
    #   dense MLP 6·10·64·96 = 368,640; MoE 6·10·64·(2·16 + 16) + 2·10·64·4 = 184,320 + 5,120 = 189,440
    #   LM head 2·10·64·50 = 64,000 -> forward 955,520
    cfg = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 96,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "moe_intermediate_size": 16,
        "num_experts_per_tok": 2,
        "vocab_size": 50,
    }
    m = model_shape(cfg)
    assert m is not None and m.mla is not None and m.moe_layers == 1 and m.shared_ffn == 16
    assert forward_flops(m, [10]) == 955_520
    # slime PR 1980's bug the other way round: a dense config carrying null MLA sizes is not MLA
    dense = model_shape({**QWEN25_05B, "kv_lora_rank": None, "q_lora_rank": None, "qk_rope_head_dim": 64})
    assert dense is not None and dense.mla is None
    assert forward_flops(dense, [1024]) == 1_056_729_726_976


def test_six_n_t_plus_attention_matches_a_real_models_matmul_parameters(tmp_path):
    """Training = 3 × forward = 6·N·T + 6·L·H·d·Σs² with N the matmul weights a token meets (every
    ``nn.Linear`` of the HF model, the LM head included even when tied; no embedding lookup, norms, biases)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import json

    from transformers import AutoModelForCausalLM

    from slime.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny", seed=0)
    cfg = json.loads((path / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(str(path))
    n = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    m = model_shape(cfg)
    assert m is not None
    lengths = [7, 12, 3]
    attention = 6 * m.layers * m.heads * m.head_dim * sum(s * s for s in lengths)
    assert TRAIN_PASSES * forward_flops(m, lengths) == 6 * n * sum(lengths) + attention


def test_an_unreadable_config_has_no_shape():
    assert model_shape({"model_type": "mystery"}) is None
    assert model_shape({"text_config": QWEN25_05B}) == model_shape(QWEN25_05B)
