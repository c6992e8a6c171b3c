"""The RL runtime: Ray orchestration of trainer ranks, engines and the rollout manager.

Modules: ``driver`` (the loop and its lifecycle, ``python -m slime.train``; one rollout step
is ``Driver.rollout_step``), ``job`` (the Ray resources a run starts and stops), ``weight_sync``
(actor → engines, colocated memory release/resume), ``train_state`` (the loop's counters and
the checkpoints that carry them), ``record`` (one ``metrics.jsonl`` line), ``trainer_group``
(trainer ranks as Ray actors), ``rollout_manager`` (prompts → scored samples, evals, SFT
data), ``train_data`` (samples → tensors, advantages), ``checkpoint`` (atomic, keep-K dirs),
``metrics`` / ``plots`` / ``progress`` / ``summary`` (observability), ``state`` (state.json,
graceful stop), ``failures`` (exception → exit code). The runtime reaches backends only
through ``slime.backends.base`` and the engine client. Importing this package imports nothing.
"""
