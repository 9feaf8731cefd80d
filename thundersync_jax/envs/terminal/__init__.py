"""Terminal tasks in a SETA-like format (instruction, setup script, checker script).

from thundersync_jax.envs import terminal
for task in terminal.generate_tasks(21, seed=0):
    with terminal.TerminalEnv(task) as env:
        prompt = env.reset()
        ...  # env.step(ToolCall("bash", {"command": "ls"})), env.step(submit)
        reward = env.verify().reward

Published tasks (Terminal-Bench 2 / 1 task directories, images found by name):
`load_bench_tasks(DIR, images=STORE)` and `BenchTaskEnv` (bench.py, bench_env.py).
"""

from thundersync_jax.envs.terminal.bench import BenchTask
from thundersync_jax.envs.terminal.bench import load_tasks as load_bench_tasks
from thundersync_jax.envs.terminal.bench_env import BenchTaskEnv
from thundersync_jax.envs.terminal.env import TOOLS, TerminalEnv
from thundersync_jax.envs.terminal.families import FAMILIES, generate_tasks
from thundersync_jax.envs.terminal.task import CheckerScript, TerminalTask, bash, submit

__all__ = [
    "FAMILIES",
    "BenchTask",
    "BenchTaskEnv",
    "TOOLS",
    "CheckerScript",
    "TerminalEnv",
    "TerminalTask",
    "bash",
    "generate_tasks",
    "load_bench_tasks",
    "submit",
]
