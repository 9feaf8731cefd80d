"""Test-wide settings (CPU only, 8 fake devices for sharding, one compilation cache and one
warm-start cache per session), the suite's tiers and groups, and shared tiny-model fixtures.

See tests/README.md: what each tier runs and which test proves which property.
"""

import os
import shutil
import tempfile

import pytest

# Must run before jax is imported anywhere in the test session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compile time is most of the suite (measured: 58 of 75 s of tests/learner/segments_test.py is
# XLA's backend compile). Backend optimization level 0 roughly halves it; XLA:CPU's older
# elemental emitters (no MLIR fusion emitters) with LLVM's expensive passes off halve it again
# (BENCHMARKS.md "Test suite"). Their code runs ~35% slower, which only a long execution
# notices: the warm starts (120 full-batch steps) train without them (`_train_in_a_child`).
# Every process the suite starts inherits these (one key for the compilation cache); tests
# compare against references with tolerances, and bitwise tests within one set of flags.
_TEST_XLA_FLAGS = (
    "--xla_force_host_platform_device_count=8",
    "--xla_backend_optimization_level=0",
)
_COMPILE_FAST_XLA_FLAGS = (
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_llvm_disable_expensive_passes=true",
)
for _flag in _TEST_XLA_FLAGS + _COMPILE_FAST_XLA_FLAGS:
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

# Rollout engines (rollout/manager.py) run at XLA's defaults: a few programs (prefill, decode)
# executed for thousands of steps in every end-to-end run, compiled once per session (measured,
# warm 2-step smoke run: engine 10.6 vs 19.5 CPU-s; BENCHMARKS.md "Test suite").
os.environ.setdefault("THUNDERSYNC_ENGINE_XLA_FLAGS", _TEST_XLA_FLAGS[0])

# One persistent compilation cache and one warm-start (SFT) cache for everything the session
# starts: set here, before jax is imported, in the process that starts the xdist workers, so
# the workers, `python -m experiments.*` subprocesses, launch_local children, engine processes
# and notebook kernels all inherit them (they copy os.environ). `make test` hands in a fresh
# directory per run (the cache never outlives a code change); a bare `pytest` gets one here,
# removed when the session ends. JAX keys each entry by the program, the XLA flags, the
# backend and the jax/jaxlib versions, so processes with other flags simply do not share.
_OWN_CACHES = []
for _var in ("JAX_COMPILATION_CACHE_DIR", "TSJ_TEST_SFT_CACHE"):
    if not os.environ.get(_var):
        os.environ[_var] = tempfile.mkdtemp(prefix=f"tsj-{_var.lower()}-")
        _OWN_CACHES.append(os.environ[_var])
# Rendered demonstrations (schedule/demo_cache.py): every smoke-config launch renders the same
# ones for its warm start's cache key (12 sandboxed calls, ~14 s and ~9 CPU-s each time); the
# session's runs share one rendering per input set. Per run, like the caches above: the key
# does not cover the code that renders them.
os.environ.setdefault(
    "THUNDERSYNC_DEMO_CACHE_DIR", os.path.join(os.environ["TSJ_TEST_SFT_CACHE"], "demos")
)
# Cache every program, however small or quick to compile: the suite recompiles the same
# tiny-model programs in dozens of processes.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

# End-to-end modules that share a worker under `pytest -n 2` (make test): a group runs its
# modules one after another on one worker, so two multi-process runs never share the 2 cores.
# Every other module is a group of its own (its module fixtures are built once, on one
# worker). New end-to-end modules join the group that finishes first (tests/README.md).
HEAVY_GROUPS = {  # each group's modules run in this order (longest critical path first)
    "e2e_inproc": (
        "tests/learner/dry_run_test.py",
        "tests/learner/mesh_e2e_test.py",
        "tests/schedule/faults_test.py",
        "tests/train_deterministic_test.py",
        "tests/train_test.py",
        "tests/experiments/swe_grpo_vllm_test.py",
        "tests/bench/gpu_check_test.py",
    ),
    "e2e_multiproc": (
        "tests/train_multiprocess_test.py",
        "tests/learner/checkpoint_multiprocess_test.py",
        "tests/learner/replicas_test.py",
        "tests/rollout/vllm_cpu_test.py",
        "tests/rollout/vllm_moe_test.py",
    ),
}
_GROUP_OF = {path: group for group, paths in HEAVY_GROUPS.items() for path in paths}


def _group(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return _GROUP_OF.get(path, path)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduler with `_group` as the scope. (`--dist loadgroup` would do this
    with `xdist_group` marks, but xdist 3.8 tags the group onto `item._nodeid`, which pytest 9
    no longer reads: every test became its own scope.)"""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return GroupScheduling(config, log)


def pytest_addoption(parser):
    parser.addoption(
        "--nightly", action="store_true", help="also run the extra variants marked `nightly`"
    )


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):  # the controller made them; workers only used them
        for path in _OWN_CACHES:
            shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    # `nightly`: extra variants of properties a make-test test already proves (tests/README.md);
    # deselected unless --nightly or a -m expression that names the marker.
    if not (config.getoption("--nightly") or "nightly" in (config.option.markexpr or "")):
        nightly = [i for i in items if i.get_closest_marker("nightly") is not None]
        if nightly:
            config.hook.pytest_deselected(items=nightly)
            items[:] = [i for i in items if i.get_closest_marker("nightly") is None]
    # The heavy groups first (stable sort, the same order on every worker): with
    # `--no-loadscope-reorder` each worker starts on one of them at once and the light modules
    # fill in around them, instead of a heavy group starting half-way through the run.
    order = [path for paths in HEAVY_GROUPS.values() for path in paths]
    items.sort(key=lambda i: _rank(i.nodeid, order))


def _rank(nodeid: str, order: list[str]) -> int:
    path = nodeid.split("::")[0]
    return order.index(path) if path in order else len(order)


# Prime-ish dims shared by the model and sampling tests: 5 query heads over 1 kv head, head_dim 8,
# hidden 40 != 5*8, vocab 97, so a transposed axis or a wrong head grouping fails a shape check.
TINY_QWEN3_DIMS = dict(
    vocab_size=97,
    hidden_size=40,
    intermediate_size=52,
    num_hidden_layers=2,
    num_attention_heads=5,
    num_key_value_heads=1,
    head_dim=8,
)


@pytest.fixture(scope="session")
def tiny_qwen3_dims():
    """`TINY_QWEN3_DIMS` as a fresh dict (HF config keys), e.g. for a transformers config."""
    return dict(TINY_QWEN3_DIMS)


@pytest.fixture(scope="session")
def tiny_qwen3_config():
    """Factory: `make(**overrides)` -> `qwen3.Qwen3Config` with `TINY_QWEN3_DIMS` and overrides."""
    from thundersync_jax.models import qwen3

    def make(**overrides):
        return qwen3.Qwen3Config(**{**TINY_QWEN3_DIMS, **overrides})

    return make


@pytest.fixture(scope="session")
def random_qwen3():
    """Factory: `make(cfg, seed, **kwargs)` -> `qwen3.Qwen3` with far-from-default random weights.

    Drawn in numpy (`qwen3.random_state_dict`) and loaded through the HF-layout path: no per-op
    XLA compilation as an eager `qwen3.Qwen3(cfg, rngs=...)` init would cost (~1.5 s CPU).
    """
    from thundersync_jax.models import qwen3

    def make(cfg, seed, **kwargs):
        return qwen3.from_hf_state_dict(cfg, qwen3.random_state_dict(cfg, seed), **kwargs)

    return make


@pytest.fixture(scope="session")
def tiny_policy():
    """Factory: `make(seed, num_hidden_layers=1)` -> (cfg, graphdef, params) of a random policy.

    Small enough to compile in seconds, with 3 query heads over 1 kv head (GQA exercised);
    shared by the learner, algorithm and schedule tests.
    """
    from flax import nnx

    from thundersync_jax.models import qwen3

    def make(seed: int, num_hidden_layers: int = 1):
        cfg = qwen3.Qwen3Config(
            vocab_size=53,
            hidden_size=24,
            intermediate_size=40,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=8,
            tie_word_embeddings=True,
        )
        graphdef, params = nnx.split(qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed)), nnx.Param)
        return cfg, graphdef, params

    return make


@pytest.fixture(scope="session")
def warm_start():
    """Factory: `warm_start(family)` -> the workdir of a 0-step run of that family's smoke
    config, whose `final/` is the exported warm start ("grpo": `configs/cpu.py:smoke` at seed
    42, "opd": `configs/terminal_opd_cpu.py:smoke`, teacher included).

    Trained once per session in TSJ_TEST_SFT_CACHE, under a file lock, so the two xdist
    workers never train the same warm start side by side; every later run of that config
    (in-process or `python -m experiments.*`) finds it there (the cache is keyed by config and
    demonstrations, not by workdir).
    """
    root = os.environ["TSJ_TEST_SFT_CACHE"]
    os.makedirs(root, exist_ok=True)

    def make(family: str) -> str:
        return _run_once(
            f"init-{family}", lambda: _warm_start_config(family, root), xla_defaults=True
        )

    return make


def _run_once(name: str, make_config, xla_defaults: bool = False) -> str:
    """TSJ_TEST_SFT_CACHE/`name`: `train.run(make_config())` there unless a previous caller (any
    worker of the session) finished it; under a file lock, so it is never run twice at once.
    `xla_defaults`: train with XLA's own optimizations (`_train_in_a_child`)."""
    return _once(name, lambda workdir: _train_in_a_child(make_config(), workdir, xla_defaults))


def _once(name: str, produce) -> str:
    """TSJ_TEST_SFT_CACHE/`name` after `produce(workdir)` wrote its `final/` there, unless a
    previous caller (any worker of the session) did; under a file lock, never twice at once."""
    import fcntl

    root = os.environ["TSJ_TEST_SFT_CACHE"]
    workdir = os.path.join(root, name)
    with open(os.path.join(root, f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(workdir, "final", "model.safetensors")):
            produce(workdir)
    return workdir


def _train_in_a_child(config, workdir: str, xla_defaults: bool = False) -> None:
    """`train.run(config, workdir)` in a child process without the compile-fast XLA flags
    (programs run ~35% faster), and with `xla_defaults` at XLA's own optimization level too:
    a warm start is 120 full-batch steps of one program, where a compiled-once program's speed
    is what counts (measured: 0.9 vs 1.6 s per SFT step; the warm start's losses and the smoke
    run's rewards and mixed groups are unchanged, BENCHMARKS.md "Test suite")."""
    import pickle
    import subprocess
    import sys

    path = os.path.join(os.path.dirname(workdir), f".{os.path.basename(workdir)}.config.pickle")
    with open(path, "wb") as f:
        pickle.dump(config, f)
    script = (
        "import pickle, sys\nfrom thundersync_jax import train\n"
        "train.run(pickle.load(open(sys.argv[1], 'rb')), sys.argv[2])"
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dropped = _COMPILE_FAST_XLA_FLAGS + (_TEST_XLA_FLAGS[1:] if xla_defaults else ())
    flags = [f for f in os.environ["XLA_FLAGS"].split() if f not in dropped]
    env = dict(os.environ, PYTHONPATH=repo, PYTHONUNBUFFERED="1", XLA_FLAGS=" ".join(flags))
    out = subprocess.run([sys.executable, "-c", script, path, workdir], cwd=repo, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, f"training {workdir} failed:\n{out.stderr[-4000:]}"


@pytest.fixture(scope="session")
def shared_run(warm_start):
    """Factory: `shared_run(family)` -> the workdir of that family's smoke config trained for
    2 steps under `stream` from the session's warm start (`shared_run_config`).

    Several modules compare against exactly this run (GRPO: tests/train_test.py's stream
    schedule; tests/train_multiprocess_test.py's one-process reference, OPD's under --nightly):
    it runs once per session, in whichever worker asks first, under a file lock; the others
    read its files.
    """
    root = os.environ["TSJ_TEST_SFT_CACHE"]

    def make(family: str) -> str:
        warm_start(family)
        return _run_once(f"stream-{family}", lambda: shared_run_config(family, root))

    return make


SHARED_RUN_STEPS = 2


@pytest.fixture(scope="session")
def two_processes():
    """`run(worker, *args, timeout)` -> the finished `subprocess.CompletedProcess` (output
    captured) of the script `worker` run by experiments.launch_local as two jax.distributed
    processes with 4 fake CPU devices each (gloo); the launcher stops both if one dies."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(worker: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=repo)
        cmd = [*_launch_local(2, grace_s=3), sys.executable, worker, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=repo,
                              env=env)  # fmt: skip

    return run


@pytest.fixture(scope="session")
def launch_local():
    """`(num_processes, grace_s)` -> the experiments.launch_local command prefix
    (`_launch_local`): the program's own command line follows it."""
    return _launch_local


def _launch_local(num_processes: int, grace_s: int) -> list[str]:
    """experiments.launch_local with `num_processes` processes of 4 fake CPU devices each, up to
    `--`: the launcher stops the others `grace_s` after one dies."""
    import sys

    return [sys.executable, "-m", "experiments.launch_local", f"--num_processes={num_processes}",
            "--devices_per_process=4", f"--grace_s={grace_s}", "--"]  # fmt: skip


@pytest.fixture(scope="session")
def deterministic_run(warm_start):
    """Factory: `deterministic_run()` -> the workdir of `deterministic_command("sync", ...)`:
    GRPO's smoke config on exact tallies, one learner process on 4 fake devices (fsdp=2 x
    tp=2), 2 steps. The bits every other schedule, interruption and process count must
    reproduce: tests/train_deterministic_test.py's `group` run (engine SIGKILLed mid-batch)
    and tests/train_multiprocess_test.py's 2-process `stream` run (a process SIGKILLed, the
    run resumed). It alone evaluates after every step (EVAL_FLAGS, read by
    tests/evaluation_test.py), so those runs, without evaluation, also prove that evaluation
    leaves training bitwise unchanged. Trained once per session, under a file lock, by
    whichever asks first."""

    def make() -> str:
        warm_start("grpo")  # its SFT cache entry, under its own lock
        return _once("deterministic-sync", _launch_deterministic_sync)

    return make


def _launch_deterministic_sync(workdir: str) -> None:
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo, PYTHONUNBUFFERED="1")
    cmd = _deterministic_command("sync", workdir, evaluate=True)
    out = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, f"{workdir} failed:\n{out.stdout[-4000:]}{out.stderr[-2000:]}"


@pytest.fixture(scope="session")
def deterministic_command():
    """`(schedule, workdir)` -> `deterministic_run`'s command line under `schedule`, without its
    evaluation (`_deterministic_command`)."""
    return _deterministic_command


# Held-out evaluation in `deterministic_run`: 2 generated tasks x 2 samples after every step
# (pass@1 and pass@2; any success reaches the target) and TensorBoard on, ~11 CPU-s a run
# (a run with evaluation on and another without it, for the comparison, cost 82 CPU-s).
EVAL_FLAGS = ("--config.eval.every_steps=1", "--config.eval.k=2", "--config.eval.num_tasks=2",
              "--config.eval.target=1e-9", "--config.metrics.tensorboard=True")  # fmt: skip


def _deterministic_command(schedule: str, workdir: str, evaluate: bool = False) -> list[str]:
    """`deterministic_run`'s command line under `schedule` (launch_local, one process on 4
    fake devices, fsdp=2 x tp=2, replicas checked bitwise every step); `evaluate`: with
    EVAL_FLAGS, as `deterministic_run` itself."""
    import sys

    root = os.environ["TSJ_TEST_SFT_CACHE"]
    reporting = list(EVAL_FLAGS) if evaluate else ["--config.metrics.tensorboard=False"]
    return [*_launch_local(1, grace_s=5),
            sys.executable, "-m", "experiments.swe_grpo", "--config=configs/cpu.py:smoke",
            f"--workdir={workdir}", f"--config.schedule={schedule}",
            f"--config.num_steps={SHARED_RUN_STEPS}", "--config.seed=42",
            "--config.rl.deterministic=True", f"--config.sft.cache_dir={root}",
            f"--config.rollout.snapshot_root={os.path.join(root, 'shm')}",
            "--config.metrics.timeline_every=0", *reporting,
            "--config.mesh.fsdp=2", "--config.mesh.tp=2",
            "--config.distributed.debug_check_replicas=True"]  # fmt: skip


def shared_run_config(family: str, root: str):
    """The `shared_run` config: the warm start's, `stream`, 2 steps, a checkpoint each step."""
    c = _warm_start_config(family, root)
    c.schedule = "stream"
    c.num_steps = SHARED_RUN_STEPS
    c.checkpoint.every = 1
    return c


def _warm_start_config(family: str, root: str):
    from configs import cpu, terminal_opd_cpu

    if family == "grpo":
        c = cpu.get_config("smoke")
        c.seed = 42
    elif family == "opd":
        c = terminal_opd_cpu.get_config("smoke")
    else:
        raise ValueError(f"no shared warm start for {family!r}")
    c.num_steps = 0
    c.sft.cache_dir = root
    c.rollout.snapshot_root = os.path.join(root, "shm")
    c.metrics.timeline_every = 0
    c.metrics.tensorboard = False
    return c
