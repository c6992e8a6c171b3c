"""The RL runtime: Ray orchestration of trainer ranks, engines and the rollout manager.

Modules: ``driver`` (the loop and its lifecycle), ``trainer_group`` (trainer
ranks as Ray actors), ``rollout_manager`` (prompts → scored samples, evals,
SFT data), ``train_data`` (samples → tensors, advantages), ``checkpoint``
(atomic, keep-K), ``metrics`` / ``plots`` / ``progress`` / ``summary``
(observability), ``state`` (state.json, graceful stop), ``resources`` (Ray
resource shares and thread counts). Importing this package imports nothing.
"""
