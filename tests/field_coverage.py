"""Every leaf field of the spec (slime/spec/schema/v1.json) and what honours or refuses it: one table.

A field is accepted only if something reads it, or a rule refuses the combinations nothing honours.
Each row maps a field path (``[]`` = every item of a list, ``*`` = every entry of a map) to entries:

* ``Read(consumer, *tests)``: ``consumer`` is ``"module:qualname"`` of the function that reads the
  field for its effect; ``tests`` are node ids of tests that show the effect (the first one at least;
  a wiring test that the value reaches the component may come with the component's own test);
* ``Refused(rule, *tests)``: a rule of ``slime.spec.rules`` refuses the combinations the runtime cannot
  honour (``rule`` names the function); ``tests`` show the refusal (message asserted);
* ``Fixed(why)``: the schema allows a single value, so there is nothing to honour;
* ``Gap(why)``: accepted and not (yet) honoured, with who fixes it — ``tests/unit/test_field_coverage.py``
  lists these loudly and fails once a gap's consumer appears, so the row must then change.

``tests/unit/test_field_coverage.py`` checks the table against the schema (every leaf has a row, no
row without a leaf), that each consumer module's function really references the field, that each
rule exists and each test exists. To add a field: add its row here with the consumer and the test
that shows its effect (or the rule and its test).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FIELDS", "Fixed", "Gap", "Read", "Refused"]


@dataclass(frozen=True)
class Read:
    consumer: str
    tests: tuple[str, ...]

    def __init__(self, consumer: str, *tests: str) -> None:
        object.__setattr__(self, "consumer", consumer)
        object.__setattr__(self, "tests", tests)


@dataclass(frozen=True)
class Refused:
    rule: str
    tests: tuple[str, ...]

    def __init__(self, rule: str, *tests: str) -> None:
        object.__setattr__(self, "rule", rule)
        object.__setattr__(self, "tests", tests)


@dataclass(frozen=True)
class Fixed:
    why: str


@dataclass(frozen=True)
class Gap:
    why: str
    consumer: str  # where the fix will read it (the test fails once it does, so the row gets updated)


Entry = Read | Refused | Fixed | Gap

# Test modules, shortened below.
EFFECTS = "tests/unit/test_field_effects.py"
ROLLOUT = "tests/integration/test_rollout_fields.py"
RULES = "tests/unit/test_spec_rules.py"
LOAD = "tests/unit/test_spec_load.py"
SLURM = "tests/unit/test_slurm_render.py"
RESTARTS = "tests/unit/test_slurm_restarts.py"
TORCH = "tests/unit/test_torch_backend.py"
SANDBOX = "tests/unit/test_sandbox_spec_fields.py"
SMOKE = "tests/e2e/test_smoke.py"
RULE_CASE = f"{RULES}::test_rule_fails_with_path_message_hint_and_origin"
DERIVED = f"{LOAD}::test_derived_values_are_filled_in_the_resolved_spec"
GOLDEN = f"{SLURM}::test_rendered_script_matches_golden_and_is_valid_bash"
HEADER = f"{SLURM}::test_header_carries_every_resource_and_resilience_setting"
LOCAL_ONLY = f"{EFFECTS}::test_the_local_launcher_refuses_what_only_slurm_does"
SAMPLING = f"{EFFECTS}::test_sampling_params_come_from_the_rollout_and_eval_settings"
WANDB = f"{EFFECTS}::test_wandb_gets_project_group_entity_and_the_description_as_notes"
AGENT = f"{EFFECTS}::test_the_agent_section_reaches_the_agent_loop"
AGENT_RUN = "tests/integration/test_adapters.py::test_generate_plugin_runs_the_tool_in_a_sandbox_and_scores"
ESTIMATORS = f"{TORCH}::test_every_estimator_takes_a_finite_step"
LOSSES = "tests/unit/test_rl_losses.py"
PROPERTY = f"{SMOKE}::test_a_spec_that_validates_passes_the_smoke_without_a_bug"
EXAMPLES = f"{SMOKE}::test_every_example_spec_passes_every_stage_of_the_smoke"

# One row per field, however long: the table is read down, not edited line by line.
# fmt: off
FIELDS: dict[str, tuple[Entry, ...]] = {
    # ------------------------------------------------------------------ top level
    "apiVersion": (Fixed("only 'slime/v1'; slime.spec.load reads it to pick the schema"),),
    "kind": (Fixed("only 'RLJob'"),),
    "name": (Read("launchers.base:default_run_dir", f"{EFFECTS}::test_the_job_name_names_the_run_dir"),),
    "description": (Read("slime.runtime.metrics:WandbSink.__init__", WANDB),),
    # ------------------------------------------------------------------ cluster
    "cluster.launcher": (Read("slime.cli.commands:_dryrun", f"{EFFECTS}::test_the_launcher_is_the_one_named"),),
    "cluster.nodes": (Read("launchers.slurm.script:_header", HEADER), Refused("local_launcher", RULE_CASE),),
    "cluster.gpus_per_node": (Read("launchers.slurm.script:_header", HEADER),),
    "cluster.cpus_per_node": (Read("launchers.slurm.script:_header", GOLDEN, HEADER),),
    "cluster.mem": (Read("launchers.slurm.script:_header", GOLDEN), Refused("local_launcher", LOCAL_ONLY),),
    "cluster.time_limit": (Read("launchers.slurm.script:_header", GOLDEN), Refused("local_launcher", LOCAL_ONLY, f"{RULES}::test_slurm_limits_under_the_local_launcher_are_refused"),),
    "cluster.partition": (Read("launchers.slurm.script:_header", HEADER), Refused("local_launcher", RULE_CASE),),
    "cluster.account": (Read("launchers.slurm.script:_header", HEADER), Refused("local_launcher", LOCAL_ONLY),),
    "cluster.qos": (Read("launchers.slurm.script:_header", HEADER), Refused("local_launcher", LOCAL_ONLY),),
    "cluster.constraint": (Read("launchers.slurm.script:_header", HEADER), Refused("local_launcher", LOCAL_ONLY),),
    "cluster.exclude": (Read("launchers.slurm.script:_header", HEADER), Refused("local_launcher", LOCAL_ONLY),),
    "cluster.reservation": (Read("launchers.slurm.script:_header", HEADER), Refused("local_launcher", LOCAL_ONLY),),
    "cluster.container.image": (Read("launchers.slurm.script:_container_flags", GOLDEN), Refused("local_launcher", RULE_CASE),),
    "cluster.container.mounts": (Read("launchers.slurm.script:_container_flags", GOLDEN),),
    "cluster.container.workdir": (Read("launchers.slurm.script:_container_flags", GOLDEN),),
    "cluster.env": (Read("launchers.local.launcher:job_env", f"{EFFECTS}::test_env_and_secrets_reach_a_local_job"), Read("launchers.slurm.script:_env_lines", GOLDEN),),
    "cluster.secrets.*.env": (Read("launchers.local.launcher:job_env", f"{EFFECTS}::test_env_and_secrets_reach_a_local_job"),),
    "cluster.secrets.*.file": (Read("launchers.local.launcher:job_env", f"{EFFECTS}::test_env_and_secrets_reach_a_local_job"),),
    "cluster.network_interface": (Read("launchers.node.context:_named_interface", "tests/unit/test_launch_bootstrap.py::test_addresses_come_from_routes_and_interfaces_without_public_probes"),),
    "cluster.bootstrap_timeout_s": (Read("launchers.node.bootstrap:Bootstrap.run_head", "tests/e2e/test_slurm_e2e.py::test_a_node_whose_ray_cannot_start_fails_the_job_within_the_timeout_naming_it"),),
    "cluster.on_preflight_failure": (Read("launchers.slurm.restarts:requeue_excluding", f"{RESTARTS}::test_after_a_bootstrap_failure_naming_a_node_requeue_excluding_moves_the_job_off_it"), Refused("local_launcher", LOCAL_ONLY),),
    "cluster.max_requeues": (Read("launchers.slurm.restarts:budget", f"{RESTARTS}::test_budgets_are_separate_and_say_which_is_spent"), Refused("local_launcher", LOCAL_ONLY),),
    "cluster.max_failures": (Read("launchers.slurm.restarts:budget", f"{RESTARTS}::test_budgets_are_separate_and_say_which_is_spent"), Refused("local_launcher", LOCAL_ONLY),),
    "cluster.signal_grace_s": (Read("launchers.slurm.script:_header", HEADER), Refused("local_launcher", LOCAL_ONLY),),
    # ------------------------------------------------------------------ model
    "model.path": (Read("slime.runtime.job:model_dir", f"{EFFECTS}::test_the_model_comes_from_model_path_or_the_builtin"),),
    "model.builtin": (Read("slime.runtime.job:model_dir", f"{EFFECTS}::test_the_model_comes_from_model_path_or_the_builtin"),),
    "model.ref_path": (Read("slime.runtime.driver:Driver.init_ref", "tests/integration/test_runtime_ppo.py::test_ppo_with_critic_reference_and_kl_penalty"), Refused("algorithm", RULE_CASE),),
    "model.critic_path": (Read("slime.runtime.job:Job.start", "tests/integration/test_runtime_ppo.py::test_ppo_with_critic_reference_and_kl_penalty"),),
    "model.tokenizer": (Read("slime.runtime.rollout_manager:RolloutManager.setup", "tests/unit/test_engine_tokenizer.py::test_the_builtin_engine_decodes_with_model_tokenizer"), Read("slime.backends.rollout.builtin.backend:engine_kwargs", "tests/unit/test_engine_tokenizer.py::test_engine_kwargs_pass_model_tokenizer_only_when_it_is_another_dir"),),
    "model.max_context_len": (Read("slime.agent.generate:AgentConfig.from_spec", AGENT), Refused("sampling", RULE_CASE),),
    # ------------------------------------------------------------------ train
    "train.backend": (Read("slime.runtime.trainer_group:TrainerRank.__init__", f"{EFFECTS}::test_the_train_backend_is_the_one_named"),),
    "train.nodes": (Read("slime.spec.layout:_plan", "tests/unit/test_spec_layout.py::test_colocated_rollout_larger_than_the_actor_uses_more_nodes"),),
    "train.gpus_per_node": (Read("slime.spec.layout:_plan", "tests/unit/test_spec_layout.py::test_disaggregated_partial_nodes_never_share_a_gpu"),),
    "train.parallel.tensor": (Read("slime.backends.megatron.render:render_megatron_args", "tests/unit/test_sglang_launch.py::test_grpo_multinode_megatron_args_golden"), Refused("parallel_sizes", RULE_CASE),),
    "train.parallel.pipeline": (Read("slime.backends.megatron.render:render_megatron_args", f"{EFFECTS}::test_megatron_args_carry_the_parallel_sizes"), Refused("parallel_sizes", RULE_CASE),),
    "train.parallel.context": (Read("slime.backends.megatron.render:render_megatron_args", f"{EFFECTS}::test_megatron_args_carry_the_parallel_sizes"), Refused("parallel_sizes", RULE_CASE),),
    "train.parallel.expert": (Refused("parallel_sizes", RULE_CASE), Gap("the megatron backend on this branch passes no expert-parallel size to megatron-core; the megatron-models branch (issue #12's Megatron half) does, and its merge replaces this row", "slime.backends.megatron.render:render_megatron_args"),),
    "train.parallel.sequence_parallel": (Read("slime.backends.megatron.render:render_megatron_args", f"{EFFECTS}::test_megatron_args_carry_the_parallel_sizes"), Refused("parallel_sizes", RULE_CASE),),
    "train.global_batch_size": (Read("slime.runtime.driver:Driver.sft_warmup", EXAMPLES), Read("slime.backends.megatron.render:render_megatron_args", "tests/unit/test_sglang_launch.py::test_grpo_multinode_megatron_args_golden"), Refused("batch_sizes", RULE_CASE),),
    "train.num_steps_per_rollout": (Read("slime.runtime.driver:Driver.rollout_step", EXAMPLES), Refused("batch_sizes", RULE_CASE),),
    "train.micro_batch_size": (Read("slime.backends.train.torch_backend:TorchTrainBackend._micro_batches", f"{TORCH}::test_micro_batching_does_not_change_the_step"), Refused("batch_sizes", RULE_CASE),),
    "train.dynamic_batch.enabled": (Read("slime.backends.train.torch_backend:TorchTrainBackend._micro_batches", f"{EFFECTS}::test_dynamic_batch_packs_micro_batches_by_tokens"),),
    "train.dynamic_batch.max_tokens_per_gpu": (Read("slime.backends.train.torch_backend:TorchTrainBackend._micro_batches", f"{EFFECTS}::test_dynamic_batch_packs_micro_batches_by_tokens"), Refused("dynamic_batch", RULE_CASE),),
    "train.optimizer.name": (Fixed("only 'adam' (AdamW; Megatron's optimizer on megatron)"),),
    "train.optimizer.lr": (Read("slime.backends.train.torch_backend:TorchTrainBackend.init", f"{EFFECTS}::test_the_optimizer_and_its_schedule_follow_the_spec"),),
    "train.optimizer.min_lr": (Read("slime.backends.train.torch_backend:TorchTrainBackend.train_step", f"{EFFECTS}::test_the_optimizer_and_its_schedule_follow_the_spec"), Refused("optimizer", RULE_CASE),),
    "train.optimizer.lr_schedule": (Read("slime.backends.train.torch_backend:TorchTrainBackend.train_step", f"{EFFECTS}::test_the_optimizer_and_its_schedule_follow_the_spec"),),
    "train.optimizer.warmup_steps": (Read("slime.backends.train.torch_backend:TorchTrainBackend.train_step", f"{EFFECTS}::test_the_optimizer_and_its_schedule_follow_the_spec"),),
    "train.optimizer.weight_decay": (Read("slime.backends.train.torch_backend:TorchTrainBackend.init", f"{EFFECTS}::test_the_optimizer_and_its_schedule_follow_the_spec"),),
    "train.optimizer.betas": (Read("slime.backends.train.torch_backend:TorchTrainBackend.init", f"{EFFECTS}::test_the_optimizer_and_its_schedule_follow_the_spec"),),
    "train.optimizer.eps": (Read("slime.backends.train.torch_backend:TorchTrainBackend.init", f"{EFFECTS}::test_the_optimizer_and_its_schedule_follow_the_spec"),),
    "train.optimizer.clip_grad": (Read("slime.backends.train.torch_backend:TorchTrainBackend.train_step", f"{EFFECTS}::test_the_optimizer_and_its_schedule_follow_the_spec"),),
    "train.optimizer.distributed": (Read("slime.backends.megatron.config:optimizer_config_kwargs", f"{EFFECTS}::test_a_sharded_optimizer_is_megatrons_and_derived_there"), Refused("optimizer", f"{EFFECTS}::test_the_torch_backend_refuses_megatron_only_settings"),),
    "train.checkpoint.dir": (Read("slime.runtime.driver:Driver.__init__", "tests/unit/test_runtime_user_errors.py::test_a_checkpoint_dir_that_cannot_be_created_fails_at_setup_naming_it"),),
    "train.checkpoint.interval": (Read("slime.runtime.driver:Driver.train", "tests/e2e/test_quickstart.py::test_shortened_quickstart_increases_reward_and_writes_its_outputs"),),
    "train.checkpoint.keep": (Read("slime.runtime.driver:Driver.__init__", "tests/unit/test_runtime_checkpoint.py::test_latest_is_the_newest_complete_and_old_ones_are_pruned"),),
    "train.checkpoint.load": (Read("slime.runtime.driver:Driver.setup", "tests/unit/test_runtime_user_errors.py::test_a_damaged_load_checkpoint_says_to_change_train_checkpoint_load"),),
    "train.checkpoint.save_hf": (Read("slime.runtime.driver:Driver.finish", PROPERTY),),
    "train.precision": (Read("slime.backends.megatron.render:render_megatron_args", "tests/unit/test_sglang_launch.py::test_grpo_multinode_megatron_args_golden"), Refused("devices", f"{EFFECTS}::test_half_precision_needs_gpus"),),
    "train.seed": (Read("slime.runtime.rollout_manager:RolloutManager.generate", "tests/integration/test_runtime_rollout.py::test_rollouts_are_reproducible_across_managers_engines_and_resume"),),
    "train.backend_args": (Read("slime.backends.megatron.render:render_megatron_args", "tests/unit/test_sglang_launch.py::test_grpo_multinode_megatron_args_golden"), Refused("backend_args", f"{EFFECTS}::test_the_torch_backend_refuses_megatron_only_settings", RULE_CASE),),
    # ------------------------------------------------------------------ rollout
    "rollout.backend": (Read("slime.runtime.job:Job.start", "tests/unit/test_sglang_launch.py::test_non_sglang_specs_are_refused", EXAMPLES),),
    "rollout.colocate": (Read("slime.runtime.weight_sync:WeightSync.__init__", "tests/integration/test_runtime_colocation.py::test_without_colocation_release_does_nothing"), Read("slime.spec.layout:_plan", "tests/unit/test_spec_layout.py::test_disaggregated_partial_nodes_never_share_a_gpu"),),
    "rollout.gpus": (Read("slime.spec.layout:layout_counts", "tests/unit/test_spec_layout.py::test_disaggregated_partial_nodes_never_share_a_gpu"), Refused("rollout_gpus", RULE_CASE),),
    "rollout.gpus_per_engine": (Read("slime.backends.sglang.launch:_tp_size", "tests/unit/test_sglang_launch.py::test_pp_size_divides_gpus_per_engine_and_reserved_keys_are_rejected_from_specs"), Refused("engine_support", RULE_CASE),),
    "rollout.num_engines": (Read("slime.spec.layout:_cpu_layout", "tests/unit/test_spec_layout.py::test_cpu_layout_one_rank_per_node_and_round_robin_engines"), Refused("rollout_gpus", RULE_CASE),),
    "rollout.batch_size": (Read("slime.runtime.rollout_manager:RolloutManager.generate", "tests/integration/test_runtime_rollout.py::test_a_rollout_is_scored_groups_with_logprobs_and_versions"),),
    "rollout.n_samples_per_prompt": (Read("slime.runtime.rollout_manager:RolloutManager.generate", "tests/integration/test_runtime_rollout.py::test_a_rollout_is_scored_groups_with_logprobs_and_versions"),),
    "rollout.over_sampling_batch_size": (Refused("batch_sizes", f"{EFFECTS}::test_over_sampling_beyond_the_batch_is_refused", RULE_CASE),),
    "rollout.num_rollouts": (Read("slime.runtime.driver:Driver.train", EXAMPLES),),
    "rollout.epochs": (Read("slime.spec.resolve:resolve", f"{LOAD}::test_num_rollouts_from_epochs_counts_the_prompt_file"), Refused("rollout_count", RULE_CASE),),
    "rollout.max_prompt_len": (Read("slime.runtime.rollout_manager:RolloutManager.setup", "tests/unit/test_data.py::test_chat_template_and_prompt_length_filter"), Refused("sampling", RULE_CASE),),
    "rollout.max_response_len": (Read("slime.runtime.rollout_manager:RolloutManager._sampling_params", SAMPLING, f"{ROLLOUT}::test_responses_stop_at_max_response_len"),),
    "rollout.temperature": (Read("slime.runtime.rollout_manager:RolloutManager._sampling_params", SAMPLING), Refused("sampling", RULE_CASE),),
    "rollout.top_p": (Read("slime.runtime.rollout_manager:RolloutManager._sampling_params", SAMPLING, "tests/integration/test_engine_api.py::test_sampling_seed_reproducible_and_filters"),),
    "rollout.top_k": (Read("slime.runtime.rollout_manager:RolloutManager._sampling_params", SAMPLING, "tests/integration/test_engine_api.py::test_sampling_seed_reproducible_and_filters"),),
    "rollout.stop": (Read("slime.runtime.rollout_manager:RolloutManager._sampling_params", SAMPLING, "tests/integration/test_engine_api.py::test_max_new_tokens_gives_length_and_eos_gives_stop"),),
    "rollout.weight_sync": (Read("slime.runtime.weight_sync:WeightSync.__init__", "tests/integration/test_runtime_weight_sync.py::test_collective_sync_matches_disk"), Refused("weight_sync_support", RULE_CASE),),
    "rollout.engine_args": (Read("slime.backends.sglang.launch:engine_commands", "tests/unit/test_sglang_launch.py::test_engine_args_conversion"), Read("slime.backends.rollout.builtin.backend:engine_kwargs", "tests/unit/test_engine_tokenizer.py::test_engine_kwargs_pass_model_tokenizer_only_when_it_is_another_dir"), Refused("engine_args_known", RULE_CASE),),
    "rollout.router_args": (Refused("engine_support", RULE_CASE),),
    "rollout.startup_timeout_s": (Read("slime.backends.sglang.backend:SGLangRolloutBackend.start", "tests/integration/test_sglang_process.py::test_never_healthy_times_out_and_everything_is_stopped"),),
    # ------------------------------------------------------------------ data
    "data.prompts": (Read("slime.runtime.rollout_manager:RolloutManager.setup", "tests/integration/test_runtime_errors.py::test_a_prompt_file_gone_bad_after_submit_fails_with_file_line_and_exit_2"),),
    "data.input_key": (Read("slime.runtime.rollout_manager:RolloutManager.setup", f"{ROLLOUT}::test_data_keys_pick_the_prompt_label_and_metadata"),),
    "data.label_key": (Read("slime.runtime.rollout_manager:RolloutManager.setup", f"{ROLLOUT}::test_data_keys_pick_the_prompt_label_and_metadata"),),
    "data.metadata_key": (Read("slime.runtime.rollout_manager:RolloutManager.setup", f"{ROLLOUT}::test_data_keys_pick_the_prompt_label_and_metadata"),),
    "data.apply_chat_template": (Read("slime.runtime.rollout_manager:RolloutManager.setup", f"{ROLLOUT}::test_data_keys_pick_the_prompt_label_and_metadata"),),
    "data.shuffle": (Read("slime.runtime.rollout_manager:RolloutManager.setup", f"{ROLLOUT}::test_data_keys_pick_the_prompt_label_and_metadata"),),
    "data.eval[].name": (Read("slime.runtime.rollout_manager:RolloutManager.evaluate", f"{ROLLOUT}::test_eval_sets_take_their_size_samples_and_temperature"), Refused("data_sets", RULE_CASE),),
    "data.eval[].path": (Read("slime.runtime.rollout_manager:RolloutManager._eval_set", f"{ROLLOUT}::test_eval_sets_take_their_size_samples_and_temperature"),),
    "data.eval[].interval": (Read("slime.runtime.driver:due_evals", f"{EFFECTS}::test_evals_are_due_on_their_interval_and_at_the_end"),),
    "data.eval[].n_samples_per_prompt": (Read("slime.runtime.rollout_manager:RolloutManager.evaluate", f"{ROLLOUT}::test_eval_sets_take_their_size_samples_and_temperature"),),
    "data.eval[].temperature": (Read("slime.runtime.rollout_manager:RolloutManager.evaluate", f"{ROLLOUT}::test_eval_sets_take_their_size_samples_and_temperature"),),
    "data.eval[].max_prompts": (Read("slime.runtime.rollout_manager:RolloutManager.evaluate", f"{ROLLOUT}::test_eval_sets_take_their_size_samples_and_temperature"),),
    # ------------------------------------------------------------------ reward
    "reward.type": (Read("slime.rl.rewards:reward_from_spec", "tests/unit/test_rl_rewards.py::test_factory_validates_its_arguments"), Refused("reward", RULE_CASE),),
    "reward.custom": (Read("slime.rl.rewards:reward_from_spec", "tests/unit/test_rl_rewards_slime_plugins.py::test_import_maps_the_plugin_and_its_reward_key"), Refused("reward", RULE_CASE),),
    "reward.url": (Read("slime.rl.rewards:reward_from_spec", f"{EFFECTS}::test_a_remote_reward_gets_its_url_timeout_and_retries"), Refused("reward", RULE_CASE),),
    "reward.key": (Read("slime.rl.rewards:reward_from_spec", "tests/unit/test_rl_remote_reward.py::test_reward_key_picks_the_entry_of_a_slime_style_reply"), Refused("reward", RULE_CASE),),
    "reward.timeout_s": (Read("slime.rl.rewards:reward_from_spec", f"{EFFECTS}::test_a_remote_reward_gets_its_url_timeout_and_retries", "tests/unit/test_rl_remote_reward.py::test_timeouts_are_retried_then_reported"),),
    "reward.max_retries": (Read("slime.rl.rewards:reward_from_spec", f"{EFFECTS}::test_a_remote_reward_gets_its_url_timeout_and_retries", "tests/unit/test_rl_remote_reward.py::test_retries_are_bounded_and_429_is_retried"),),
    # ------------------------------------------------------------------ algorithm
    "algorithm.estimator": (Read("slime.backends.train.torch_backend:TorchTrainBackend._policy_loss", ESTIMATORS),),
    "algorithm.eps_clip": (Read("slime.backends.train.torch_backend:TorchTrainBackend._policy_loss", f"{EFFECTS}::test_clipping_settings_change_the_policy_loss"),),
    "algorithm.eps_clip_high": (Read("slime.backends.train.torch_backend:TorchTrainBackend._policy_loss", f"{EFFECTS}::test_clipping_settings_change_the_policy_loss"),),
    "algorithm.dual_clip_c": (Read("slime.backends.train.torch_backend:TorchTrainBackend._policy_loss", ESTIMATORS), Refused("algorithm", RULE_CASE),),
    "algorithm.kl_coef": (Read("slime.runtime.trainer_group:TrainerRank.prepare", "tests/integration/test_runtime_ppo.py::test_ppo_with_critic_reference_and_kl_penalty"), Refused("algorithm", RULE_CASE),),
    "algorithm.kl_loss_coef": (Read("slime.backends.train.torch_backend:TorchTrainBackend._policy_loss", f"{EFFECTS}::test_kl_loss_settings_change_the_policy_loss"), Refused("algorithm", RULE_CASE),),
    "algorithm.kl_loss_type": (Read("slime.backends.train.torch_backend:TorchTrainBackend._policy_loss", f"{EFFECTS}::test_kl_loss_settings_change_the_policy_loss"),),
    "algorithm.entropy_coef": (Read("slime.backends.train.torch_backend:TorchTrainBackend._policy_loss", ESTIMATORS),),
    "algorithm.normalize_std": (Read("slime.runtime.driver:Driver.rollout_step", f"{EFFECTS}::test_normalize_std_scales_group_scores"), Refused("algorithm", RULE_CASE),),
    "algorithm.gamma": (Read("slime.runtime.trainer_group:TrainerRank.prepare", f"{EFFECTS}::test_gamma_and_lambda_reach_the_advantages"),),
    "algorithm.lambda": (Read("slime.runtime.trainer_group:TrainerRank.prepare", f"{EFFECTS}::test_gamma_and_lambda_reach_the_advantages"),),
    "algorithm.loss_agg": (Read("slime.backends.train.torch_backend:TorchTrainBackend.train_step", "tests/unit/test_migrate_maths.py::test_slime_default_averages_per_sample"),),
    "algorithm.critic.lr": (Read("slime.backends.train.torch_backend:TorchTrainBackend.init", f"{EFFECTS}::test_the_critic_takes_its_own_lr_and_value_clip"), Refused("algorithm", RULE_CASE),),
    "algorithm.critic.value_clip": (Read("slime.backends.train.torch_backend:TorchTrainBackend._value_loss", f"{EFFECTS}::test_the_critic_takes_its_own_lr_and_value_clip"),),
    "algorithm.sft_warmup_steps": (Read("slime.runtime.driver:Driver.sft_warmup", "tests/integration/test_runtime_resume.py::test_a_run_reports_correctness_signals_and_learns_something"),),
    "algorithm.sft_warmup_lr": (Read("slime.backends.train.torch_backend:TorchTrainBackend._sft_opt", f"{EFFECTS}::test_the_sft_warmup_takes_its_own_lr"),),
    # ------------------------------------------------------------------ agent
    "agent.sandbox.backend": (Read("slime.agent.generate:sandbox_kwargs", f"{SANDBOX}::test_e2b_backend_sets_the_per_process_limits_in_every_command"),),
    "agent.sandbox.image": (Read("slime.agent.generate:sandbox_kwargs", f"{EFFECTS}::test_an_e2b_sandbox_gets_its_template_network_and_key"), Refused("agent", RULE_CASE),),
    "agent.sandbox.timeout_s": (Read("slime.agent.generate:sandbox_kwargs", f"{SANDBOX}::test_local_backend_gets_every_limit_including_the_whole_sandbox_caps", AGENT),),
    "agent.sandbox.network": (Read("slime.agent.generate:sandbox_kwargs", f"{EFFECTS}::test_an_e2b_sandbox_gets_its_template_network_and_key", "tests/integration/test_sandbox_local.py::test_host_loopback_reachable_only_with_network"),),
    "agent.sandbox.memory_mb": (Read("slime.agent.generate:sandbox_kwargs", f"{SANDBOX}::test_local_backend_gets_every_limit_including_the_whole_sandbox_caps"),),
    "agent.sandbox.cpu_time_s": (Read("slime.agent.generate:sandbox_kwargs", f"{SANDBOX}::test_local_backend_gets_every_limit_including_the_whole_sandbox_caps"),),
    "agent.sandbox.max_procs": (Read("slime.agent.generate:sandbox_kwargs", f"{SANDBOX}::test_local_backend_gets_every_limit_including_the_whole_sandbox_caps"),),
    "agent.sandbox.max_file_mb": (Read("slime.agent.generate:sandbox_kwargs", f"{SANDBOX}::test_local_backend_gets_every_limit_including_the_whole_sandbox_caps"),),
    "agent.sandbox.work_mb": (Read("slime.agent.generate:sandbox_kwargs", f"{SANDBOX}::test_local_backend_gets_every_limit_including_the_whole_sandbox_caps"), Refused("agent", RULE_CASE),),
    "agent.sandbox.total_memory_mb": (Read("slime.agent.generate:sandbox_kwargs", f"{SANDBOX}::test_local_backend_gets_every_limit_including_the_whole_sandbox_caps"), Refused("agent", RULE_CASE),),
    "agent.sandbox.allow_unisolated": (Read("slime.agent.generate:sandbox_kwargs", AGENT, "tests/integration/test_sandbox_local.py::test_unisolated_fallback_keeps_limits_and_timeout"), Refused("agent", RULE_CASE),),
    "agent.sandbox.api_key_secret": (Read("slime.agent.generate:sandbox_kwargs", f"{EFFECTS}::test_an_e2b_sandbox_gets_its_template_network_and_key"), Refused("agent", RULE_CASE),),
    "agent.adapter": (Read("slime.agent.generate:AgentConfig.from_spec", AGENT, AGENT_RUN),),
    "agent.max_turns": (Read("slime.agent.generate:AgentConfig.from_spec", AGENT, "tests/integration/test_adapters.py::test_turn_cap_and_closed_session_are_refused"),),
    "agent.generate": (Read("slime.agent.generate:fill_samples", f"{EFFECTS}::test_an_agent_generate_plug_in_is_the_one_called"),),
    "agent.tools": (Read("slime.agent.generate:AgentConfig.from_spec", AGENT, AGENT_RUN),),
    # ------------------------------------------------------------------ sweep
    "sweep.grid": (Read("slime.spec.load:_sweep_tasks", "tests/unit/test_spec_sweep.py::test_tasks_are_resolved_each_on_their_own"),),
    "sweep.max_parallel": (Read("launchers.slurm.script:_header", f"{SLURM}::test_sweep_is_one_array_with_max_parallel_and_task_offset"), Refused("local_launcher", LOCAL_ONLY),),
    # ------------------------------------------------------------------ logging
    "logging.dir": (Read("launchers.base:default_run_dir", f"{EFFECTS}::test_the_job_name_names_the_run_dir"),),
    "logging.wandb.mode": (Read("slime.runtime.metrics:WandbSink.__init__", "tests/unit/test_runtime_observability.py::test_wandb_disabled_by_env_and_run_id_reused", WANDB),),
    "logging.wandb.project": (Read("slime.runtime.metrics:WandbSink.__init__", WANDB),),
    "logging.wandb.group": (Read("slime.runtime.metrics:WandbSink.__init__", WANDB),),
    "logging.wandb.entity": (Read("slime.runtime.metrics:WandbSink.__init__", WANDB),),
    "logging.progress": (Read("slime.runtime.driver:Driver.train", f"{EFFECTS}::test_a_progress_bar_only_with_logging_progress"),),
}
# fmt: on
