"""The Megatron-core train backend (``train.backend: megatron``).

``config`` (HF config → megatron-core arguments, parallel rules, attention
choice), ``convert`` (HF ↔ Megatron state dicts, TP/PP sharding) and
``render`` (the exact arguments a spec runs with) are pure Python + torch and
import without megatron-core. ``attention``, ``logprobs`` and ``backend``
import megatron-core, which is an optional extra (``pip install
slime-submit[megatron]``, installed with ``--no-deps`` beside an existing CUDA
torch); nothing here imports it at package import time.
"""
