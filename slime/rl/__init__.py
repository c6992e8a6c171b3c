"""RL pieces shared by every backend (import the modules directly: this package imports nothing).

Free of torch: ``sample`` (the per-response ``Sample``), ``plugins`` (reward / generate / rollout /
filter Protocols), ``rewards`` (the ``REWARDS`` registry and its ``BUILTIN_REWARDS`` table),
``micro_batches`` (the one micro-batch planner of both train backends). With torch: ``kl`` (k1, k2, k3,
low_var_kl), ``masked`` (masked means, aggregation, whitening), ``advantages`` (GRPO/GSPO/CISPO,
REINFORCE++, PPO GAE), ``losses`` (policy/value/entropy/KL/SFT losses) and ``train_loss`` (the spec's
``algorithm`` settings mapped onto those losses, for both train backends).
"""
