"""The RL runtime: Ray orchestration of trainer ranks, engines and the rollout manager.

Start at ``driver`` (the loop, ``python -m slime.train``; one step is ``Driver.rollout_step``);
``job`` starts and stops Ray resources, ``trainer_group`` drives the ranks, ``rollout_manager`` and
``rollout`` turn prompts into scored samples, ``train_data`` / ``step_plan`` turn them into tensors
and steps, ``weight_sync``, ``train_state`` / ``checkpoint``, ``record`` / ``metrics`` / ``perf`` /
``summary`` (observability), ``state`` and ``failures`` (exit codes). The runtime reaches backends
only through ``slime.backends.base`` and the engine client. Importing this package imports nothing.
"""
