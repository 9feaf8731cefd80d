"""The segment benchmark's library code runs end to end on a tiny model (timings not checked)."""

import numpy as np
import pytest

from thundersync_jax.learner import segment_bench

TINY = dict(
    vocab_size=53,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
)


@pytest.mark.slow
def test_tables_and_plot(tmp_path):
    graphdef, params, cfg = segment_bench.build(TINY)
    timing = dict(repeats=1, warmup=0)
    opd = segment_bench.opd_costs(graphdef, params, cfg, 128, [1, 4], prefix_step=64, **timing)
    grpo = segment_bench.grpo_prompt_costs(graphdef, params, cfg, 64, 2, [0.25], **timing)
    result = dict(total_tokens=128, member_tokens=64, group_size=2, opd=opd, grpo=grpo)
    rows = opd["rows"]
    assert [r["turns"] for r in rows] == [1, 4]
    # Full prefix: one prefix bucket per turn, each turn priced at its bucket's measured cost.
    four = rows[1]["full_prefix"]
    costs = opd["bucket_cost"]
    want = 2 * costs["64"].cpu + 2 * costs["128"].cpu  # turns end at 32, 64, 96, 128
    assert np.isclose(four.cpu, want)
    assert all(
        r["segments"].wall > 0 and r["tail_turn"].cpu > 0 and r["tail_x"].wall > 0 for r in rows
    )
    assert grpo[0]["ideal_saving"] == 0.125
    table = segment_bench.markdown(result)
    assert "| 4 |" in table and "| 25% |" in table
    segment_bench.plot(result, str(tmp_path / "cost.png"))
    assert (tmp_path / "cost.png").stat().st_size > 1000
