"""Names vulture (`make lint`) reports as unused that are used, reviewed one by one.

vulture reads the package, experiments/, configs/ and bench/; it does not see the tests,
notebooks and docs that use the public API below, nor frameworks that call by name.
Regenerate the candidates with
  vulture thundersync_jax experiments configs bench --make-whitelist
and keep here only what is really used; delete dead code instead of listing it.
"""

# ruff: noqa

# Context-manager protocol: __exit__(exc_type, exc, tb) must take the argument.
exc  # unused variable (thundersync_jax/envs/agent_samplers.py:101)
exc  # unused variable (thundersync_jax/envs/base.py:79)
exc  # unused variable (thundersync_jax/envs/images/layout.py:240)
exc  # unused variable (thundersync_jax/envs/sandbox/_core.py:172)
exc  # unused variable (thundersync_jax/metrics/_progress.py:50)
exc  # unused variable (thundersync_jax/metrics/_writer.py:113)
exc  # unused variable (thundersync_jax/rollout/client.py:222)
exc  # unused variable (thundersync_jax/rollout/manager.py:146)
exc  # unused variable (thundersync_jax/teacher/_scorer.py:152)
exc  # unused variable (thundersync_jax/teacher/_service.py:151)

# Fields of records (NamedTuples, dataclasses, tarfile members, HF tokenizer parts) that users, tests and the metrics read by name.
_.terminal_families  # unused attribute (configs/terminal_opd_cpu.py:78)
_.tool_start  # unused attribute (thundersync_jax/envs/agent_loop.py:138)
_.tool_end  # unused attribute (thundersync_jax/envs/agent_loop.py:151)
_.context_len  # unused attribute (thundersync_jax/envs/agent_loop.py:221)
_.verify_start  # unused attribute (thundersync_jax/envs/agent_loop.py:224)
_.end_time  # unused attribute (thundersync_jax/envs/agent_loop.py:228)
_.gid  # unused attribute (thundersync_jax/envs/images/build.py:62)
_.gname  # unused attribute (thundersync_jax/envs/images/build.py:63)
_.uname  # unused attribute (thundersync_jax/envs/images/build.py:63)
elapsed_s  # unused variable (thundersync_jax/envs/sandbox/_types.py:35)
context_len  # unused variable (thundersync_jax/envs/trajectory.py:139)
tool_start  # unused variable (thundersync_jax/envs/trajectory.py:140)
tool_end  # unused variable (thundersync_jax/envs/trajectory.py:141)
end_time  # unused variable (thundersync_jax/envs/trajectory.py:180)
verify_start  # unused variable (thundersync_jax/envs/trajectory.py:181)
num_rows  # unused variable (thundersync_jax/learner/buckets.py:32)
num_positions  # unused variable (thundersync_jax/learner/buckets.py:33)
_.compiled_programs  # unused attribute (thundersync_jax/learner/replicas.py:92)
student_logprobs  # unused variable (thundersync_jax/learner/segment_state.py:78)
_.pre_tokenizer  # unused attribute (thundersync_jax/models/tokenizer.py:212)
_.decoder  # unused attribute (thundersync_jax/models/tokenizer.py:213)
last_arrival_s  # unused variable (thundersync_jax/schedule/learner_loop.py:47)
_.last_arrival_s  # unused attribute (thundersync_jax/schedule/learner_loop.py:84)
learner_work_lb_s  # unused variable (thundersync_jax/sim/_ceiling.py:35)
lower_bound_s  # unused variable (thundersync_jax/sim/_ceiling.py:37)
max_speedup  # unused variable (thundersync_jax/sim/_ceiling.py:38)
balance_speedup  # unused variable (thundersync_jax/sim/_ceiling.py:39)

# Called by frameworks by name: Orbax's CheckpointHandler protocol, vLLM's worker extension, the package's lazy module loader.
__getattr__  # unused function (thundersync_jax/rollout/__init__.py:29)
_.validate  # unused method (thundersync_jax/rollout/snapshot_commit.py:38)
_.validate_final  # unused method (thundersync_jax/rollout/snapshot_commit.py:46)
_.create  # unused method (thundersync_jax/rollout/snapshot_commit.py:54)
_.metadata  # unused method (thundersync_jax/rollout/snapshot_handler.py:196)
SnapshotWorkerExtension  # unused class (thundersync_jax/rollout/vllm_weights.py:101)
_.load_thundersync_snapshot  # unused method (thundersync_jax/rollout/vllm_weights.py:104)

# Public API used by tests, notebooks, docs or the command line (accumulators.reference and
# replay, models helpers, sim bridges, metrics of the verifier, Schedule properties).
grpo_gradient  # unused function (thundersync_jax/accumulators/reference.py:79)
direct_gradient  # unused function (thundersync_jax/accumulators/reference.py:112)
relative_error  # unused function (thundersync_jax/accumulators/reference.py:126)
peak_open_groups  # unused function (thundersync_jax/accumulators/replay.py:22)
replay  # unused function (thundersync_jax/accumulators/replay.py:36)
QWEN3_CHAT_TEMPLATE  # unused variable (thundersync_jax/envs/chat.py:298)
whiteout  # unused function (thundersync_jax/envs/images/build.py:83)
opaque  # unused function (thundersync_jax/envs/images/build.py:89)
_.workspace  # unused property (thundersync_jax/envs/terminal/env.py:115)
_.valid_calls  # unused property (thundersync_jax/envs/tool_calls.py:39)
_.num_errors  # unused property (thundersync_jax/envs/trajectory.py:147)
_.turn_mask  # unused method (thundersync_jax/envs/trajectory.py:201)
failure_metrics  # unused function (thundersync_jax/envs/verify.py:89)
reset_failure_counts  # unused function (thundersync_jax/envs/verify.py:97)
engine_logprob_gap  # unused function (thundersync_jax/losses/logprob_gap.py:68)
unmerge  # unused function (thundersync_jax/models/lora.py:247)
generate_compilations  # unused function (thundersync_jax/models/sampling.py:177)
shard_params  # unused function (thundersync_jax/models/sharding.py:128)
train_bpe  # unused function (thundersync_jax/models/tokenizer.py:193)
_.wait_ready  # unused method (thundersync_jax/rollout/client.py:189)
find_vllm_python  # unused function (thundersync_jax/rollout/engine_cmd.py:149)
_.policy_lag  # unused property (thundersync_jax/schedule/schedules.py:60)
_.overlaps_rollouts  # unused property (thundersync_jax/schedule/schedules.py:65)
timeline_from_sim  # unused function (thundersync_jax/sim/timelines.py:58)

# Public API used by the tests and users (the reference temperature transform of the whole
# logits; G = N / K of a config), no longer called inside the package since attention and the
# LM head moved to models.attention and losses.tiled_token_terms.
tempered  # unused function (thundersync_jax/learner/chunks.py)
num_query_groups  # unused property (thundersync_jax/models/qwen3/_config.py, qwen3_moe/_config.py)
