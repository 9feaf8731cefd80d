r"""Per-turn OPD as segments vs one-shot and full-prefix gradients; GRPO shared prompts.

    python -m experiments.bench_segments --out=bench/segments.json --plot=docs/segments_cost.png

Prints two markdown tables (see `thundersync_jax.learner.segment_bench`): OPD learner time of
one trajectory split into 1, 4, 16, 64 turns relative to its one-shot gradient (target <= 2x;
the full-prefix mode grows like (n+1)/2), with the tail after the last score for `turn` vs
`trajectory` granularity; and the GRPO shared-prompt saving at prompt shares 10/30/60%. The
model (d_model 256, 4 layers, vocab 2048) is large enough that compute, not dispatch,
dominates on CPU. Takes about 10 minutes on 2 shared CPU cores.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from thundersync_jax.learner import segment_bench

_OUT = flags.DEFINE_string("out", "", "write the result as JSON here (optional)")
_PLOT = flags.DEFINE_string("plot", "", "write the two-panel PNG here (optional)")
_TOKENS = flags.DEFINE_integer("tokens", 1024, "tokens of the OPD trajectory")
_TURNS = flags.DEFINE_list("turns", ["1", "4", "16", "64"], "turn counts")
_MEMBER_TOKENS = flags.DEFINE_integer("member_tokens", 512, "tokens per GRPO group member")
_GROUP = flags.DEFINE_integer("group_size", 4, "GRPO group size")
_SHARES = flags.DEFINE_list("shares", ["0.1", "0.3", "0.6"], "prompt shares of member tokens")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed repeats per measurement (median)")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "d_model")
_LAYERS = flags.DEFINE_integer("layers", 4, "decoder layers")

MODEL = dict(
    vocab_size=2048,
    intermediate_size=768,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)


def main(argv):
    del argv
    model = dict(MODEL, hidden_size=_HIDDEN.value, num_hidden_layers=_LAYERS.value)
    graphdef, params, cfg = segment_bench.build(model)
    timing = dict(repeats=_REPEATS.value, warmup=1)
    result = dict(
        model=model,
        total_tokens=_TOKENS.value,
        member_tokens=_MEMBER_TOKENS.value,
        group_size=_GROUP.value,
        opd=segment_bench.opd_costs(
            graphdef,
            params,
            cfg,
            _TOKENS.value,
            [int(x) for x in _TURNS.value],
            prefix_step=128,
            **timing,
        ),
        grpo=segment_bench.grpo_prompt_costs(
            graphdef,
            params,
            cfg,
            _MEMBER_TOKENS.value,
            _GROUP.value,
            [float(x) for x in _SHARES.value],
            **timing,
        ),
    )
    print(segment_bench.markdown(result))
    for path in (_OUT.value, _PLOT.value):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(result, f, indent=2, default=lambda t: t._asdict())
    if _PLOT.value:
        segment_bench.plot(result, _PLOT.value)


if __name__ == "__main__":
    app.run(main)
