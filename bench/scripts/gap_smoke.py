"""The engine/learner log-prob gap of one smoke stream step (BENCHMARKS.md, "Engines and
publication"). Run from the repository root: PYTHONPATH=. python bench/scripts/gap_smoke.py"""

import json
from pathlib import Path

import tests.train_test as tt
from thundersync_jax import train

base = Path("/tmp/gap_smoke")
base.mkdir(parents=True, exist_ok=True)
c = tt._grpo_config("stream", 1, base)
train.run(c, str(base / "stream"))
print(json.dumps(tt._metrics(str(base / "stream"))))
