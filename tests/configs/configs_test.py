"""Every config file in configs/ loads (each variant) and its model initializes under eval_shape."""

import importlib
import pathlib

import jax
import ml_collections
import pytest
from flax import nnx

from thundersync_jax.learner import memory
from thundersync_jax.models import auto

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / "configs"
# cpu.py is the coordinator's and may not exist yet; every file present is covered.
CONFIG_FILES = sorted(
    p.stem for p in CONFIG_DIR.glob("*.py") if p.stem not in ("__init__", "common")
)


def _variants(name):
    module = importlib.import_module(f"configs.{name}")
    return [(module, arg) for arg in getattr(module, "VARIANTS", (None,))]


CASES = [case for name in CONFIG_FILES for case in _variants(name)]


def test_known_config_files_are_present():
    assert {"b200", "h200"} <= set(CONFIG_FILES)


@pytest.mark.parametrize("module, arg", CASES, ids=[f"{m.__name__}:{a}" for m, a in CASES])
def test_config_loads(module, arg):
    c = module.get_config(arg)
    assert isinstance(c, ml_collections.ConfigDict)
    assert module.__doc__ and "python -m " in module.__doc__  # the launch command
    if "mesh" in c:
        assert c.mesh.fsdp >= 1 and c.mesh.tp >= 1
    # The model section carries every run-time key (the learner, the planner and the dry run
    # read them all; a recipe that builds its own section must too).
    from configs import common
    from thundersync_jax.models import hf_config

    assert set(hf_config.RUNTIME_KEYS) <= set(common.get_base_config().model)
    missing = set(hf_config.RUNTIME_KEYS) - set(c.model)
    assert not missing, f"{module.__name__}:{arg} model section lacks {sorted(missing)}"


def _distinct_models():
    seen = {}
    for module, arg in CASES:
        config = module.get_config(arg)
        if "model" not in config:  # e.g. benchmark configs without a policy model
            continue
        key = repr(sorted(config.model.to_dict().items()))
        seen.setdefault(key, (f"{module.__name__}:{arg}", config))
    return list(seen.values())


MODELS = _distinct_models()


# make test traces each model at 4 layers (0.2-0.4 s): the per-layer shapes and dtypes, the
# planner's count (one traced layer times the depth) and GLM's dense first layer beside MoE
# ones. Tracing a 64-layer init takes 16-22 s per recipe: full depth is nightly.
DEPTHS = [4, pytest.param(None, marks=pytest.mark.nightly, id="full_depth")]


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("name, config", MODELS, ids=[n for n, _ in MODELS])
def test_model_init_eval_shapes(name, config, depth):
    """eval_shape of the model's init (no memory is allocated) at `depth` layers (None: the
    config's own depth)."""
    config = config.copy_and_resolve_references()  # MODELS is shared by the cases
    if depth is not None:
        config.model.num_hidden_layers = min(depth, config.model.num_hidden_layers)
    model_config = config.model
    cfg = auto.config_from_section(model_config)
    dtype = jax.numpy.dtype(model_config.param_dtype)
    abstract = nnx.eval_shape(lambda: auto.build(cfg, param_dtype=dtype))
    params = nnx.split(abstract, nnx.Param)[1]
    leaves = jax.tree.leaves(params)
    assert {x.dtype for x in leaves} == {dtype}
    count = sum(x.size for x in leaves)
    # The memory planner counts one traced layer times the depth; the full init must agree.
    if "node" in config:
        assert memory.param_shard_elements(config)[0] == count


TRAINING_CONFIGS = [("cpu", None), ("cpu", "smoke"), ("terminal_opd_cpu", None)]
TRAINING_CONFIGS += [("terminal_opd_cpu", "smoke")]


@pytest.mark.parametrize("name, arg", TRAINING_CONFIGS)
@pytest.mark.parametrize("schedule", ["sync", "group", "stream", "async"])
def test_training_configs_pass_the_start_up_check_under_every_schedule(name, arg, schedule):
    from thundersync_jax import train

    c = importlib.import_module(f"configs.{name}").get_config(arg)
    c.schedule = schedule
    algo, sched, family = train.check(c)
    assert (algo.name, sched.name, family.name) == (c.rl.algorithm, schedule, c.env.family)


def test_unknown_task_family_names_the_valid_ones():
    from configs import cpu
    from thundersync_jax import train
    from thundersync_jax.schedule.config_check import ConfigError

    c = cpu.get_config("smoke")
    c.env.family = "swe_bench"
    valid = "mini_swe, swe_jsonl, swe_dataset, terminal, terminal_bench"
    with pytest.raises(ConfigError, match=f"choose one of: {valid}"):
        train.check(c)


@pytest.mark.parametrize("name, family", [("cpu", "terminal"), ("terminal_opd_cpu", "mini_swe")])
def test_every_algorithm_takes_every_task_family(name, family):
    from thundersync_jax import train

    c = importlib.import_module(f"configs.{name}").get_config("smoke")
    c.env.family = family
    assert train.check(c)[2].name == family
