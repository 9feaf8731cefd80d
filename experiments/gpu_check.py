r"""The GPU check of issue 18: one script, one JSON (see thundersync_jax/bench/gpu_check.py).

    python -m experiments.gpu_check --out=runs/gpu_check.json            # one H200, ~5-8 min
    python -m experiments.gpu_check --cpu --out=runs/gpu_check_cpu.json  # tiny, CPU, ~5 min

Needs the vLLM environment for the engine (`--engine_python`, default: engine_cmd's choice:
$THUNDERSYNC_VLLM_PYTHON or .venv-vllm). On a GPU the learner gets half the device
(XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 unless set) and vLLM 0.3 of it, so both fit on one H200.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

_CPU = flags.DEFINE_bool("cpu", False, "tiny sizes on CPU (the tested path)")
_OUT = flags.DEFINE_string("out", "runs/gpu_check.json", "where the JSON report goes")
_WORKDIR = flags.DEFINE_string("workdir", "runs/gpu_check", "scratch directory")
_PARTS = flags.DEFINE_list("parts", ["learner", "long", "vllm", "stream_sync"], "parts to run")
_PYTHON = flags.DEFINE_string("engine_python", "", "interpreter with vLLM (default: engine_cmd)")


def main(argv):
    del argv
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    from configs import cpu
    from thundersync_jax.bench import gpu_check
    from thundersync_jax.rollout import engine_cmd

    python = _PYTHON.value or engine_cmd.engine_python(cpu.get_config("vllm"))
    report = gpu_check.run(
        cpu=_CPU.value, workdir=os.path.abspath(_WORKDIR.value), python=python,
        parts=tuple(_PARTS.value),
    )  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    app.run(main)
