"""Shared defaults for every config; each config file overrides what it needs.

Sections: model (HF config.json fields), tokenizer, mesh, lora, rl, optim,
rollout, env, learner, checkpoint, metrics, sft. Every leaf has a default here
so a typo in `--config.x.y=...` fails loudly (the ConfigDict is locked).
"""

from __future__ import annotations

import ml_collections


def tiny_qwen3_model() -> ml_collections.ConfigDict:
    """A tiny Qwen3 that trains in minutes on 2 CPU cores (byte-level vocabulary)."""
    return ml_collections.ConfigDict(
        dict(
            model_type="qwen3",
            vocab_size=384,  # 256 bytes + special tokens, padded
            hidden_size=64,
            intermediate_size=176,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rope_theta=10000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            attention_bias=False,
            max_position_embeddings=4096,
            checkpoint="",  # HF safetensors directory; empty = random init
            dtype="float32",  # activation / compute dtype
            param_dtype="float32",
            remat=False,  # per-layer rematerialization for long sequences
            # MoE policies: "replay" the experts the engine routed each token to in the
            # learner's score-gradient forward (gate weights from the learner's own router),
            # or "recompute" them; dense models ignore it.
            routing="replay",
        )
    )


def get_base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.num_steps = 20
    c.schedule = "stream"  # sync | group | stream | async
    c.model = tiny_qwen3_model()
    # kind: auto (model.checkpoint's tokenizer if it has one, else byte) | byte | hf (path).
    c.tokenizer = ml_collections.ConfigDict(dict(kind="auto", path=""))
    c.mesh = ml_collections.ConfigDict(
        dict(fsdp=1, tp=1, rules=())
    )  # rules: ((logical, mesh axis), ...) over the defaults
    c.lora = ml_collections.ConfigDict(
        dict(
            enabled=False,
            rank=8,
            alpha=16.0,
            targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
            publish="adapters",  # adapters | merged
        )
    )
    c.rl = ml_collections.ConfigDict(
        dict(
            algorithm="grpo",  # grpo | opd
            num_groups=4,
            group_size=4,
            advantage="grpo",
            loss_agg="seq-mean-token-mean",
            eps=1e-6,
            std_ddof=1,
            max_len=0,  # for seq-mean-token-sum-norm; 0 = rollout.max_traj_tokens
            max_open_groups=0,  # 0 = no cap
            # OPD: trajectories whose learner KV cache is kept at once (0 = no cap); turns of a
            # new trajectory wait while that many are open (backpressure, never OOM).
            max_open_trajectories=0,
            # OPD: turn = per-turn segments over the learner's cache (linear cost, streams);
            # trajectory = one gradient when the trajectory ends; auto = per step, whichever
            # the step-time predictor says is shorter on the previous step's timed turns
            # (the first two steps explore: trajectory under sync else turn, then the other).
            opd_granularity="turn",
            # GRPO: forward and backpropagate each group's prompt once (learner KV cache,
            # prompt-sized cotangent tallies); exact for affine estimators, others fall back.
            shared_prompt=False,
            kl_coef=0.0,
            kl_estimator="k3",  # k1 | k3
            entropy_coef=0.0,
            # True: every score-gradient call holds one trajectory (one OPD turn) in every
            # schedule, so a call's composition is fixed by the data, never by timing.
            deterministic=False,
            # > 0: weight each sampled token's policy-gradient term by the truncated importance
            # weight min(π_learner / π_engine, tis_cap) (DESIGN §2; for engines that sample from
            # other numbers, e.g. vLLM in bf16). 0 = off; otherwise a cap >= 1 (2 is common).
            tis_cap=0.0,
        )
    )
    # Where the accumulator's parameter-sized tallies live: "device", or "host" (host memory
    # of the learner's devices, pinned where the platform has it; GRPO only). Host tallies
    # free 2 tallies per open group of device memory at one host copy of w·h per chunk.
    c.accum = ml_collections.ConfigDict(dict(placement="device"))
    c.optim = ml_collections.ConfigDict(
        dict(
            name="adamw",
            learning_rate=1e-4,
            weight_decay=0.0,
            b1=0.9,
            b2=0.999,
            max_grad_norm=1.0,
            warmup_steps=0,  # linear learning-rate ramp over the first N applied updates
            decay_steps=0,  # > 0: cosine decay to 0 at that update (after the warmup)
            # An all-zero gradient (every group's rewards equal) skips the step instead of
            # letting Adam's momentum move the weights with no signal in the batch.
            skip_zero_grad=True,
        )
    )
    c.rollout = ml_collections.ConfigDict(
        dict(
            engine="embedded",  # embedded | vllm
            num_engines=1,
            max_batch=16,
            temperature=1.0,
            top_p=1.0,
            max_turns=8,
            max_new_tokens_per_turn=192,
            max_traj_tokens=2048,
            max_error_turns=0,  # stop after this many malformed turns in a row; 0 = never
            snapshot_root="/dev/shm/thundersync",
            request_timeout_s=300.0,
            # vLLM engine (rollout/engine_cmd.py): interpreter ("" = $THUNDERSYNC_VLLM_PYTHON or
            # .venv-vllm), extra vllm.LLM kwargs as JSON, KV-cache fraction of RAM on CPU, and
            # the load probe: tokens scored after every load, tolerance (0 = by model.dtype).
            engine_python="",
            vllm_kwargs="",
            cpu_memory_fraction=0.1,
            probe_tokens=32,
            probe_atol=0.0,
        )
    )
    c.env = ml_collections.ConfigDict(
        dict(
            family="mini_swe",  # mini_swe | terminal | swe_jsonl
            instances="",  # JSONL path for swe_jsonl
            image="",  # SWE tasks run in this OCI layout / docker-save tarball ("" = host)
            difficulty="easy",
            num_tasks=32,
            sandbox_timeout_s=20.0,
            sandbox_memory_mb=1024,
            partial_credit=False,  # reward = fraction of tests passing instead of all-or-nothing
        )
    )
    c.learner = ml_collections.ConfigDict(
        dict(
            seq_buckets=(128, 256, 512, 1024, 2048),
            pack_same_slot=True,
        )
    )
    c.checkpoint = ml_collections.ConfigDict(dict(every=5, keep=2))
    # Data-parallel learner processes (DESIGN §7): empty/0/-1 = from the launcher's
    # JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID or the cluster, else one
    # process. debug_check_replicas: hash every replica's train state after each step.
    c.distributed = ml_collections.ConfigDict(
        dict(
            coordinator_address="",
            num_processes=0,
            process_id=-1,
            init_timeout_s=120.0,
            heartbeat_timeout_s=30,
            debug_check_replicas=False,
        )
    )
    c.metrics = ml_collections.ConfigDict(dict(timeline_every=5, tensorboard=True))
    c.sft = ml_collections.ConfigDict(
        # cache_dir "" = workdir. decoys: also imitate a failed (no-op edit) attempt per task,
        # so the warm start keeps a choice at the edit that only the reward can settle.
        # on_checkpoint: also run the warm start when model.checkpoint is given (off: a user's
        # checkpoint, possibly 27B, is not fine-tuned on the toy demonstrations by default).
        dict(
            steps=200,
            learning_rate=3e-3,
            batch_size=8,
            cache_dir="",
            decoys=False,
            on_checkpoint=False,
        )
    )
    return c
