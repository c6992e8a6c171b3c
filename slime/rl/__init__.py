"""RL pieces shared by every backend: samples, plug-in contracts, KL, advantages, losses, rewards.

Modules (import them directly; this package imports nothing so that
``slime.rl.sample``, ``slime.rl.plugins`` and ``slime.rl.rewards`` stay free of torch):

- ``sample``      the mutable per-response ``Sample`` record
- ``plugins``     typed Protocols for reward / generate / rollout / filter plug-ins
- ``kl``          per-token KL estimators (k1, k2, k3, low_var_kl)          [torch]
- ``masked``      masked means, aggregation and whitening on [B, T] tensors  [torch]
- ``advantages``  GRPO/GSPO/CISPO, REINFORCE++(-baseline), PPO GAE          [torch]
- ``losses``      policy/value/entropy/KL/SFT losses and their total        [torch]
- ``rewards``     the REWARDS registry (exact, math, f1, remote, custom)
"""
