"""The RL runtime: Ray orchestration of trainer ranks, engines and the rollout manager.

Modules: ``driver`` (the loop and its lifecycle; ``python -m slime.train``),
``trainer_group`` (trainer ranks as Ray actors), ``rollout_manager`` (prompts →
scored samples, evals, SFT data), ``train_data`` (samples → tensors,
advantages), ``rollout_metrics``, ``checkpoint`` (atomic, keep-K),
``metrics`` / ``plots`` / ``progress`` / ``summary`` (observability), ``state``
(state.json, graceful stop, exit codes), ``failures`` (exception → exit code),
``resources`` (Ray resource shares, thread counts, priority). Importing this
package imports nothing.
"""
