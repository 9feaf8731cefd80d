"""Shared defaults for every config; each config file overrides what it needs.

Sections: model (HF config.json fields), tokenizer, mesh, lora, rl, optim,
rollout, env, learner, checkpoint, eval, metrics, sft. Every leaf has a default here
so a typo in `--config.x.y=...` fails loudly (the ConfigDict is locked).
"""

from __future__ import annotations

import ml_collections


def tiny_qwen3_model() -> ml_collections.ConfigDict:
    """A tiny Qwen3 that trains in minutes on 2 CPU cores (byte-level vocabulary)."""
    return ml_collections.ConfigDict(
        dict(
            model_type="qwen3",  # architecture (HF config.json `model_type`)
            vocab_size=384,  # 256 bytes + special tokens, padded
            hidden_size=64,  # width of the residual stream
            intermediate_size=176,  # width of the MLP
            num_hidden_layers=2,  # decoder layers
            num_attention_heads=4,  # query heads
            num_key_value_heads=2,  # key/value heads (grouped-query attention)
            head_dim=16,  # width of one attention head
            rope_theta=10000.0,  # rotary position embedding base
            rms_norm_eps=1e-6,  # epsilon of every RMSNorm
            tie_word_embeddings=True,  # the output head reuses the input embedding
            attention_bias=False,  # bias on the q/k/v projections (Qwen2)
            max_position_embeddings=4096,  # longest sequence the model accepts
            checkpoint="",  # HF safetensors directory; empty = random init
            dtype="float32",  # activation / compute dtype
            param_dtype="float32",  # dtype of the stored parameters
            remat=False,  # per-layer rematerialization for long sequences
            # With remat: keep each layer's input in pinned host memory, not on the device
            # (GPU; on CPU the model keeps them on the device).
            remat_offload=False,
            # Dense Qwen3: the decoder layers as one lax.scan (one compiled layer body; a
            # stacked copy of the layer weights and their gradients per step, see
            # models/qwen3/_depth.py). The MoE decoder has no scanned path.
            scan_layers=False,
            # models.attention impl: auto (cuDNN on GPU where it applies, else blockwise;
            # naive below one block pair) | naive (materializes [T, S]) | blockwise | cudnn.
            attention_impl="auto",
            # 256 on CPU: a 512 tile's float32 scores fall out of cache (measured, this model
            # at 1,535 tokens: attention gradient 0.18 s at 256, 0.39 s at 512).
            attention_block=256,  # largest blockwise query/key tile (balanced to the length)
            logits_tile=1024,  # tokens per LM-head tile for log-probs (0 = whole [T, V])
            routing="replay",  # MoE: replay the engine's experts per token, or "recompute"
        )
    )


def gpu_node(**values) -> ml_collections.ConfigDict:
    """A GPU node's layout (`config.node`, the GPU recipes'): these defaults, then `values`.

    CPU configs have no `node` section (nothing is placed on GPUs).
    """
    c = ml_collections.ConfigDict(
        dict(
            gpu="",  # the GPU model's name (B200, H200), for the figures and the reports
            num_gpus=8,  # GPUs of the node
            gpu_memory_gb=0.0,  # memory of one GPU
            memory_headroom=0.9,  # fraction of a GPU the learner may plan for (rest: runtime)
            host_memory_gb=0.0,  # system memory of the node for host tallies (0 = none planned)
            host_memory_headroom=0.95,  # fraction of host memory the tallies may use
            rollout_gpus=4,  # GPUs of the rollout engines (first in the node's order)
            rollout_tp=4,  # tensor-parallel size of one rollout engine
            learner_gpus=4,  # GPUs of the learner (after the rollout and teacher GPUs)
            chunk_rows=1,  # rows per score-gradient chunk at the longest bucket
            rollout_memory_fraction=0.9,  # fraction of each of its GPUs a rollout engine takes
            teacher_gpus=0,  # GPUs of OPD's teacher engines (after the rollout GPUs)
            teacher_tp=1,  # tensor-parallel size of one teacher engine
            teacher_memory_fraction=0.0,  # as rollout_memory_fraction (0 = the same)
        )
    )
    c.update(values)
    return c


def get_base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0  # seeds the warm start, the parameters and every sampling key
    c.num_steps = 20  # optimizer steps (one per batch) of the run
    c.schedule = "stream"  # when the learner takes a batch's work (docs/design.md)
    c.model = tiny_qwen3_model()
    c.tokenizer = ml_collections.ConfigDict(
        dict(
            kind="auto",  # auto: model.checkpoint's tokenizer if it has one, else byte
            path="",  # an HF tokenizer directory; overrides `kind`
        )
    )
    c.mesh = ml_collections.ConfigDict(
        dict(
            fsdp=1,  # learner devices the params and the batch are sharded over
            tp=1,  # learner devices each layer's matrices are split over
            rules=(),  # ((logical axis, mesh axis), ...) over the default sharding rules
        )
    )
    c.lora = ml_collections.ConfigDict(
        dict(
            enabled=False,  # train LoRA adapters instead of every parameter
            rank=8,  # rank of each adapter
            alpha=16.0,  # adapter scale alpha / rank
            # the projections that get adapters
            targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
            publish="adapters",  # what the engines receive: the adapters or the merged weights
        )
    )
    c.rl = ml_collections.ConfigDict(
        dict(
            algorithm="grpo",  # the learning algorithm (`algorithms/`)
            num_groups=4,  # prompts (groups) per batch
            group_size=4,  # trajectories sampled per prompt
            advantage="grpo",  # advantage estimator (`accumulators.register_advantage` adds one)
            loss_agg="seq-mean-token-mean",  # how token terms are weighted and normalised
            eps=1e-6,  # ε in (r − μ)/(σ + ε)
            std_ddof=1,  # 1: Bessel-corrected group std (as verl), or 0
            max_len=0,  # for seq-mean-token-sum-norm; 0 = rollout.max_traj_tokens
            max_open_groups=0,  # groups with live tallies at once (0 = no cap)
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
            kl_coef=0.0,  # coefficient of the KL term to the reference policy (0 = off)
            kl_estimator="k3",  # per-token KL estimator of that term
            entropy_coef=0.0,  # coefficient of the entropy bonus (0 = off)
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
            name="adamw",  # optimizer
            learning_rate=1e-4,  # peak learning rate
            weight_decay=0.0,  # decoupled weight decay (adamw)
            b1=0.9,  # Adam's first-moment decay
            b2=0.999,  # Adam's second-moment decay
            max_grad_norm=1.0,  # clip the finalized gradient to this global norm (0 = off)
            warmup_steps=0,  # linear learning-rate ramp over the first N applied updates
            decay_steps=0,  # > 0: cosine decay to 0 at that update (after the warmup)
            # An all-zero gradient (every group's rewards equal) skips the step instead of
            # letting Adam's momentum move the weights with no signal in the batch.
            skip_zero_grad=True,
        )
    )
    c.rollout = ml_collections.ConfigDict(
        dict(
            engine="embedded",  # the rollout engine: in-process JAX sampler or vLLM
            num_engines=1,  # rollout engine processes
            max_batch=16,  # episodes running at once (requests batched by an engine)
            temperature=1.0,  # sampling temperature (the learner scores at the same)
            top_p=1.0,  # nucleus sampling; must stay 1 (the learner scores the full softmax)
            max_turns=8,  # turns per episode
            max_new_tokens_per_turn=192,  # tokens sampled per turn
            max_traj_tokens=2048,  # tokens per trajectory (prompt, turns and observations)
            max_error_turns=0,  # stop after this many malformed turns in a row; 0 = never
            snapshot_root="/dev/shm/thundersync",  # where published weights are written
            request_timeout_s=300.0,  # an engine request unanswered this long is an error
            # vLLM engine (rollout/engine_cmd.py): interpreter ("" = $THUNDERSYNC_VLLM_PYTHON or
            # .venv-vllm), extra vllm.LLM kwargs as JSON, KV-cache fraction of RAM on CPU, and
            # the load probe: tokens scored after every load, tolerance (0 = by model.dtype).
            engine_python="",  # interpreter of the vLLM engine
            vllm_kwargs="",  # extra vllm.LLM keyword arguments, as JSON
            cpu_memory_fraction=0.1,  # vLLM's KV-cache share of RAM on CPU
            probe_tokens=32,  # tokens the load probe scores after every weight load
            probe_atol=0.0,  # the probe's tolerance in nats (0 = by model.dtype)
        )
    )
    c.env = ml_collections.ConfigDict(
        dict(
            family="mini_swe",  # the task family (a name in envs.task_families' registry)
            instances="",  # JSONL path for swe_jsonl
            # swe_dataset: SWE-smith / SWE-bench / Verified / SWE-Gym rows; images by name.
            dataset="",  # swe_dataset rows: .parquet/.jsonl/.json, save_to_disk dir or hf:ORG/NAME
            dataset_format="auto",  # row format: auto (per row) or one of envs.swe.dataset.FORMATS
            images="",  # image store dir (docker-save tarballs, OCI layouts) found by tag
            image="",  # SWE tasks run in this OCI layout / docker-save tarball ("" = host)
            difficulty="easy",  # easy | medium | hard tasks of the family
            num_tasks=32,  # tasks in the pool
            sandbox_timeout_s=20.0,  # wall-clock limit of one sandboxed command
            sandbox_memory_mb=1024,  # memory limit of the sandbox
            partial_credit=False,  # reward = fraction of tests passing instead of all-or-nothing
            # reuse the verdict of a patch already verified on the same task in this run (SWE
            # families; workdir/verdicts); off for tests whose outcome is not the patch's alone
            cache_verdicts=True,
            terminal_families=(),  # terminal family: the task kinds to draw from (empty = all)
        )
    )
    c.learner = ml_collections.ConfigDict(
        dict(
            seq_buckets=(128, 256, 512, 1024, 2048),  # padded lengths of score-gradient calls
            pack_same_slot=True,  # pack trajectories of one (group, bucket) slot into a call
        )
    )
    c.checkpoint = ml_collections.ConfigDict(
        dict(
            every=5,  # save the train state every N steps (and at the end; 0 = never)
            keep=2,  # checkpoints kept
        )
    )
    # Held-out evaluation between steps (thundersync_jax/evaluation.py) on the rollout engines,
    # with sampling keys of its own: training is bit-for-bit unchanged by it.
    c.eval = ml_collections.ConfigDict(
        dict(
            every_steps=0,  # evaluate after every N steps (0 = off)
            dataset="",  # "" = held-out generated tasks, else SWE rows read like env.dataset
            num_tasks=4,  # held-out tasks per evaluation
            k=2,  # pass@k's k (eval_pass@1 and eval_pass@k are written)
            samples=0,  # samples per task n = max(k, samples)
            temperature=1.0,  # sampling temperature of the evaluation
            target=0.0,  # pass@k that writes time_to_target_s, gpu_hours_to_target (0 = none)
        )
    )
    # Data-parallel learner processes (DESIGN §7): empty/0/-1 = from the launcher's
    # JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID or the cluster, else one
    # process. debug_check_replicas: hash every replica's train state after each step.
    c.distributed = ml_collections.ConfigDict(
        dict(
            coordinator_address="",  # host:port of process 0 ("" = from the launcher)
            num_processes=0,  # learner processes (0 = from the launcher, else 1)
            process_id=-1,  # this process's index (-1 = from the launcher)
            init_timeout_s=120.0,  # how long to wait for every process to join
            heartbeat_timeout_s=30,  # a process silent this long ends the run
            debug_check_replicas=False,  # hash every replica's train state after each step
        )
    )
    c.metrics = ml_collections.ConfigDict(
        dict(
            timeline_every=5,  # timeline picture and Chrome trace every N steps (0 = never)
            tensorboard=True,  # also write TensorBoard events
        )
    )
    c.sft = ml_collections.ConfigDict(
        # cache_dir "" = workdir. decoys: also imitate a failed (no-op edit) attempt per task,
        # so the warm start keeps a choice at the edit that only the reward can settle.
        # on_checkpoint: also run the warm start when model.checkpoint is given (off: a user's
        # checkpoint, possibly 27B, is not fine-tuned on the toy demonstrations by default).
        dict(
            steps=200,  # warm-start SFT steps on the task family's demonstrations
            learning_rate=3e-3,  # its peak learning rate
            batch_size=8,  # demonstrations per SFT step
            cache_dir="",  # where warm starts are cached ("" = workdir)
            decoys=False,  # also imitate a failed (no-op edit) attempt per task
            on_checkpoint=False,  # also warm-start a given model.checkpoint
        )
    )
    return c
