"""Engine command lines and GPU placement for every shipped config and variant."""

import json
import os
import sys

import pytest

from configs import b200, cpu, h200, terminal_opd_cpu
from thundersync_jax import gpu_node
from thundersync_jax.models import auto, qwen3
from thundersync_jax.rollout import engine_cmd
from thundersync_jax.rollout import server as rollout_server

SHIPPED = [
    ("cpu", cpu, None),
    ("cpu", cpu, "smoke"),
    ("cpu", cpu, "vllm"),
    ("terminal_opd_cpu", terminal_opd_cpu, None),
    ("terminal_opd_cpu", terminal_opd_cpu, "smoke"),
    *[("b200", b200, v) for v in b200.VARIANTS],
    *[("h200", h200, v) for v in h200.VARIANTS],
]


@pytest.mark.parametrize(("name", "module", "variant"), SHIPPED, ids=lambda x: str(x))
def test_engine_command_line_and_placement(tmp_path, name, module, variant):
    config = module.get_config(variant)
    engine_cmd.check_engine_config(config)  # what the trainer checks at start-up
    model_cfg = auto.config_from_section(config.model)
    spec = engine_cmd.rollout_engines(config, model_cfg, str(tmp_path))
    args = rollout_server.build_arg_parser().parse_args(["--address", "ipc://x", *spec.server_args])
    ro = config.rollout
    assert args.engine == ro.engine
    assert (args.max_batch, args.max_seq_len) == (ro.max_batch, ro.max_traj_tokens)
    assert (args.dtype, args.param_dtype) == (config.model.dtype, config.model.param_dtype)
    assert spec.num_engines == ro.num_engines
    if ro.engine == "vllm":
        # vLLM starts from a checkpoint: the user's, or the model's config.json + dummy weights.
        with open(os.path.join(args.checkpoint, "config.json")) as f:
            assert auto.config_from_hf(json.load(f)) == model_cfg
        assert json.loads(args.vllm_kwargs)["load_format"] == "dummy"
        assert spec.load_probe is not None
    else:
        assert auto.config_from_hf(json.loads(args.model_config)) == model_cfg
        assert spec.python == sys.executable and spec.load_probe is None
    if "node" not in config:
        assert all("CUDA_VISIBLE_DEVICES" not in env for env in spec.envs)
        return
    node = config.node
    assert (args.tp_size, args.memory_fraction) == (node.rollout_tp, node.rollout_memory_fraction)
    owned = [p.gpus for p in spec.devices]
    assert all(len(g) == node.rollout_tp for g in owned)
    flat = [g for gpus in owned for g in gpus]
    learner = gpu_node.learner_gpu_ids(config)
    assert len(set(flat)) == len(flat) == node.rollout_gpus  # each GPU to one engine
    assert not set(flat) & set(learner) and len(learner) == config.mesh.fsdp * config.mesh.tp
    assert max(flat + list(learner)) < node.num_gpus
    for env, gpus in zip(spec.envs, owned, strict=True):
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus))
        assert env["JAX_PLATFORMS"] == "cpu"  # the engine's JAX only converts snapshots


def test_h200_full_gives_three_engines_one_gpu_each(tmp_path):
    config = h200.get_config("full")
    gpus = [p.gpus for p in engine_cmd.engine_devices(config)]
    assert gpus == [(0,), (1,), (2,)]
    assert gpu_node.learner_gpu_ids(config) == (3, 4, 5, 6, 7)


def test_bad_engine_settings_are_refused_with_the_values(tmp_path):
    config = b200.get_config("lora")
    config.rollout.num_engines = 3
    with pytest.raises(ValueError, match=r"3 rollout engine\(s\) x tensor parallel 4"):
        engine_cmd.engine_devices(config)
    config = b200.get_config("lora")
    config.lora.publish = "adapters"
    with pytest.raises(ValueError, match="lora.publish='merged'"):
        engine_cmd.check_engine_config(config)
    config = b200.get_config("full")
    config.node.learner_gpus = 6
    with pytest.raises(ValueError, match="> num_gpus 8"):
        engine_cmd.engine_devices(config)
    config = cpu.get_config()
    config.rollout.engine = "sglang"
    with pytest.raises(ValueError, match="rollout.engine must be one of"):
        engine_cmd.check_engine_config(config)


def _parse(spec):
    return rollout_server.build_arg_parser().parse_args(["--address", "ipc://x", *spec.server_args])


@pytest.mark.parametrize(("name", "module", "variant"), SHIPPED, ids=lambda x: str(x))
def test_teacher_engine_command_line_for_every_shipped_config(name, module, variant):
    config = module.get_config(variant)
    if config.get("teacher") is None:  # the GRPO configs run no teacher
        assert config.rl.algorithm == "grpo"
        return
    t = config.teacher
    teacher_cfg = qwen3.Qwen3Config.from_config_dict(t.model)
    spec = engine_cmd.teacher_engines(config, teacher_cfg)
    args = _parse(spec)
    assert args.engine == "embedded" and spec.num_engines == t.num_engines
    assert (args.max_batch, args.max_seq_len) == (t.max_batch, config.rollout.max_traj_tokens)
    assert (args.dtype, args.param_dtype) == (t.model.dtype, t.model.dtype)
    assert qwen3.Qwen3Config.from_hf(json.loads(args.model_config)) == teacher_cfg
    assert not args.checkpoint and spec.python == sys.executable and spec.load_probe is None
    assert spec.envs == [{"JAX_PLATFORMS": "cpu"}] * t.num_engines  # a CPU config: no GPU
    config.teacher.checkpoint = "/models/teacher"  # the process loads a checkpoint itself
    args = _parse(engine_cmd.teacher_engines(config))
    assert args.checkpoint == "/models/teacher" and not args.model_config


def _opd_on_a_gpu_node(variant="full"):
    """b200 with an OPD teacher on GPUs 2-3: rollout 0-1 (tp 2), teacher 2-3, learner 4-7."""
    config = b200.get_config(variant)
    opd = terminal_opd_cpu.get_config()
    config.rl.algorithm, config.teacher = "opd", opd.teacher
    config.teacher.num_engines = 2
    config.node.rollout_gpus, config.node.rollout_tp = 2, 2
    config.node.teacher_gpus, config.node.teacher_tp = 2, 1
    config.node.learner_gpus = 4
    return config


def test_teacher_engines_take_the_gpus_after_the_rollout_ones():
    config = _opd_on_a_gpu_node()
    engine_cmd.check_engine_config(config)
    spec = engine_cmd.teacher_engines(
        config, qwen3.Qwen3Config.from_config_dict(config.teacher.model)
    )
    assert [p.gpus for p in spec.devices] == [(2,), (3,)]
    assert [p.gpus for p in engine_cmd.engine_devices(config)] == [(0, 1)]
    assert gpu_node.learner_gpu_ids(config) == (4, 5, 6, 7)
    # A JAX teacher runs on its GPU (no JAX_PLATFORMS=cpu) and takes only its memory fraction.
    fraction = f"{config.node.rollout_memory_fraction:.2f}"
    for env, gpu in zip(spec.envs, "23", strict=True):
        assert env == {
            "CUDA_VISIBLE_DEVICES": gpu,
            "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction,
        }
    args = _parse(spec)
    assert (args.tp_size, args.memory_fraction) == (1, config.node.rollout_memory_fraction)
    config.node.teacher_memory_fraction = 0.5
    assert (
        engine_cmd.engine_devices(config, "teacher")[0].env()["XLA_PYTHON_CLIENT_MEM_FRACTION"]
        == "0.50"
    )


def test_a_bad_teacher_placement_fails_the_start_up_check():
    from thundersync_jax import train
    from thundersync_jax.schedule.config_check import ConfigError

    config = _opd_on_a_gpu_node()
    config.teacher.num_engines = 1
    with pytest.raises(ValueError, match=r"1 teacher engine\(s\) x tensor parallel 1"):
        engine_cmd.check_engine_config(config)
    config = _opd_on_a_gpu_node()
    config.teacher.num_engines, config.node.teacher_tp = 1, 2
    with pytest.raises(ValueError, match="node.teacher_tp=2: the embedded"):
        engine_cmd.check_engine_config(config)
    config = terminal_opd_cpu.get_config("smoke")
    config.node = b200.get_config().node  # 4 rollout GPUs, no teacher GPU
    config.rollout.engine = "vllm"
    with pytest.raises(
        ConfigError,
        match=r"1 teacher engine\(s\) x tensor parallel 1 must use "
        r"exactly the 0 teacher GPUs",
    ):
        train.check(config)
    config = _opd_on_a_gpu_node()
    config.node.teacher_memory_fraction = 1.5  # (0 = the rollout engines' fraction)
    with pytest.raises(ValueError, match="node.teacher_memory_fraction must lie in"):
        engine_cmd.engine_devices(config, "teacher")
