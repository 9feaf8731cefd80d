"""Segments over the learner's own cache: per-turn OPD (direct parts + one reverse sweep) vs the
one-shot full-trajectory gradient of `chunks.py` (forward over the whole trajectory, Â from a
separate full forward), which shares no code with the segment path past the model's modules."""

import jax
import numpy as np
import pytest
from flax import nnx

from thundersync_jax.learner import chunks, segments
from thundersync_jax.learner.logprobs import TokenLogprobFn
from thundersync_jax.models import lora, qwen3

# Prime-sized dims so a transposed axis cannot go unnoticed.
CFG = qwen3.Qwen3Config(
    vocab_size=37,
    hidden_size=22,
    intermediate_size=26,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=10,
)
SEG_BUCKETS = (4, 8, 16, 32)
CACHE_BUCKETS = (64, 256, 512)


@pytest.fixture(scope="module")
def parts():
    graphdef, abstract = nnx.split(
        nnx.eval_shape(
            lambda: qwen3.Qwen3(CFG, attention_impl="naive", logits_tile=0, rngs=nnx.Rngs(0))
        ),
        nnx.Param,
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), abstract)
    return graphdef, params


@pytest.fixture(scope="module")
def adapters(parts):
    rng = np.random.default_rng(1)
    fresh = lora.init(parts[1], rank=3, alpha=6.0, key=jax.random.key(1))
    # Random A and B (a fresh B = 0 would zero every gradient for A).
    return jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), fresh)


def _episode(rng, num_turns, prompt_len=5, truncated=False):
    """An OPD episode: prompt, then turns of (observation, response) with uneven lengths.

    Returns the token array, the 0/1 mask of scored (response) tokens, teacher log-probs, and
    the segment boundaries (segment j = observation j + response j; the first holds the
    prompt). `truncated` ends the episode with an observation that is never scored.
    """
    pieces, masks = [rng.integers(1, CFG.vocab_size, prompt_len)], [np.zeros(prompt_len)]
    cuts = [0]
    for j in range(num_turns):
        obs = int(rng.integers(0, 4)) if j else 0
        resp = int(rng.integers(1, 6))
        pieces += [rng.integers(1, CFG.vocab_size, obs), rng.integers(1, CFG.vocab_size, resp)]
        masks += [np.zeros(obs), np.ones(resp)]
        cuts.append(sum(map(len, pieces)))
    if truncated:
        tail = int(rng.integers(1, 4))
        pieces.append(rng.integers(1, CFG.vocab_size, tail))
        masks.append(np.zeros(tail))
        cuts.append(sum(map(len, pieces)))
    tokens = np.concatenate(pieces).astype(np.int32)
    mask = np.concatenate(masks).astype(np.float32)
    teacher = np.where(mask > 0, -rng.uniform(0.2, 3.0, len(tokens)), 0).astype(np.float32)
    return tokens, mask, teacher, cuts


_BUILT = {}  # compiled programs shared by the tests (compilation dominates their time)


def _long_paths():
    """The model structure on blockwise attention (4-key blocks) and 3-token log-prob tiles.

    The segments run on it and the one-shot reference on `parts`' naive paths ([T, S]
    scores, whole [T, V] logits), so every comparison also checks the long paths.
    """
    model = nnx.eval_shape(
        lambda: qwen3.Qwen3(
            CFG, attention_impl="blockwise", attention_block=4, logits_tile=3, rngs=nnx.Rngs(0)
        )
    )
    return nnx.split(model, nnx.Param)[0]


def _segment_fns(graphdef, mode="full"):  # graphdef: the reference's (same params)
    if mode not in _BUILT:
        _BUILT[mode] = segments.make_segment_fns(
            _long_paths(),
            CFG,
            SEG_BUCKETS,
            CACHE_BUCKETS,
            remat=mode == "remat",
            lora=mode == "lora",
        )
    return _BUILT[mode]


def _one_shot(graphdef, params, tokens, mask, teacher, base=None):
    """h = Σ_t Â_t ∇ log π(o_t) over the whole trajectory, Â from a full-sequence forward."""
    key = ("one-shot", base is not None)
    if key not in _BUILT:
        _BUILT[key] = chunks.make_score_grad_fn(graphdef, (64, 512), lora=base is not None)
    score = _BUILT[key]
    student = TokenLogprobFn(score)(params, tokens[None], base)[0]
    adv = np.where(mask > 0, teacher - student, 0.0).astype(np.float32)
    h, n = score(params, tokens[None], mask[None], adv[None], base_params=base)
    return h, n, student


def _streamed(fns, params, tokens, mask, teacher, cuts, base=None):
    traj, parts_sum, n, logp = fns.open(), None, 0, []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        traj, res = fns.score(
            params, traj, tokens[a:b], mask[a:b], teacher_logprobs=teacher[a:b], base_params=base
        )
        n += res.num_tokens
        logp.append(res.student_logprobs)
        if res.grad is not None:
            parts_sum = res.grad if parts_sum is None else jax.tree.map(np.add, parts_sum, res.grad)
    deferred, _ = fns.close(params, traj, base_params=base)
    if deferred is not None:
        parts_sum = jax.tree.map(np.add, parts_sum, deferred)
    return parts_sum, n, np.concatenate(logp)


def _relative_error(x, y):
    a = np.concatenate([np.ravel(np.asarray(t, np.float64)) for t in jax.tree.leaves(x)])
    b = np.concatenate([np.ravel(np.asarray(t, np.float64)) for t in jax.tree.leaves(y)])
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize(
    "num_turns,mode,truncated",
    [
        (3, "full", True),
        # the rest in make test, not test-quick (the slowest of the unit tier to compile; the
        # 3-turn truncated one stays quick)
        pytest.param(1, "full", False, marks=pytest.mark.slow),
        pytest.param(7, "lora", False, marks=pytest.mark.slow),
        pytest.param(5, "remat", True, marks=pytest.mark.slow),
        pytest.param(64, "full", False, marks=pytest.mark.slow),
    ],
)
def test_streamed_turns_equal_the_one_shot_gradient(parts, adapters, num_turns, mode, truncated):
    graphdef, params = parts
    rng = np.random.default_rng(10 + num_turns)
    tokens, mask, teacher, cuts = _episode(rng, num_turns, truncated=truncated)
    trainable, base = (adapters, params) if mode == "lora" else (params, None)
    fns = _segment_fns(graphdef, mode)
    h_ref, n_ref, logp_ref = _one_shot(graphdef, trainable, tokens, mask, teacher, base)
    h, n, logp = _streamed(fns, trainable, tokens, mask, teacher, cuts, base)
    assert n == n_ref == int(mask.sum())
    np.testing.assert_allclose(logp * mask, logp_ref * mask, rtol=1e-5, atol=1e-6)
    assert jax.tree.structure(h) == jax.tree.structure(h_ref)
    assert _relative_error(h, h_ref) <= 1e-5
    # Each segment forwarded once by the direct pass and once by the sweep, bucketed shapes.
    # (program, segment bucket, attended-past bucket or 0, cache capacity): bounded.
    assert fns.compiles <= 3 * len(SEG_BUCKETS) * (len(CACHE_BUCKETS) + 1) * len(CACHE_BUCKETS)


def test_failed_episode_closed_early_equals_the_one_shot_of_what_it_got(parts):
    graphdef, params = parts
    tokens, mask, teacher, cuts = _episode(np.random.default_rng(3), 6)
    kept = cuts[:4]  # the episode failed after three turns: the rest never arrives
    fns = _segment_fns(graphdef)
    end = kept[-1]
    h_ref, n_ref, _ = _one_shot(graphdef, params, tokens[:end], mask[:end], teacher[:end])
    h, n, _ = _streamed(fns, params, tokens, mask, teacher, kept)
    assert n == n_ref
    assert _relative_error(h, h_ref) <= 1e-5


def test_free_cache_slots_are_masked_out_exactly(parts):
    """Garbage in slots past the trajectory's length changes nothing, bit for bit."""
    graphdef, params = parts
    tokens, mask, teacher, cuts = _episode(np.random.default_rng(4), 3)
    fns = _segment_fns(graphdef)
    clean, _, _ = _streamed(fns, params, tokens, mask, teacher, cuts)

    rng = np.random.default_rng(5)
    traj = fns.open()
    noise = rng.normal(0, 50.0, traj.k.shape).astype(np.float32)
    traj = traj._replace(k=traj.k + noise, v=traj.v - noise)
    total = None
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        traj, res = fns.score(params, traj, tokens[a:b], mask[a:b], teacher_logprobs=teacher[a:b])
        total = res.grad if total is None else jax.tree.map(np.add, total, res.grad)
    deferred, _ = fns.close(params, traj)
    noisy = jax.tree.map(np.add, total, deferred)
    for x, y in zip(jax.tree.leaves(noisy), jax.tree.leaves(clean), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_grpo_token_weights_and_cache_growth(parts):
    """GRPO-style weights (no teacher) over a trajectory that outgrows its first capacity."""
    graphdef, params = parts
    rng = np.random.default_rng(6)
    tokens = rng.integers(1, CFG.vocab_size, 90).astype(np.int32)
    mask = np.zeros(90, np.float32)
    mask[10:] = 1
    weights = rng.normal(size=90).astype(np.float32)
    fns = _segment_fns(graphdef)
    traj, total = fns.open(capacity=20), None
    assert traj.capacity == 64
    for a, b in [(0, 10), (10, 40), (40, 70), (70, 90)]:
        traj, res = fns.score(params, traj, tokens[a:b], mask[a:b], token_weights=weights[a:b])
        if res.grad is not None:
            total = res.grad if total is None else jax.tree.map(np.add, total, res.grad)
    assert traj.capacity == 256
    # k, v, dk, dv: four float32 [L, 1, S, K, H] arrays.
    assert traj.nbytes == 4 * 4 * CFG.num_hidden_layers * 256 * CFG.num_key_value_heads * 10
    deferred, _ = fns.close(params, traj)
    total = jax.tree.map(np.add, total, deferred)
    h_ref, _ = chunks.make_score_grad_fn(graphdef, (128,))(
        params, tokens[None], mask[None], weights[None]
    )
    assert _relative_error(total, h_ref) <= 1e-5


def test_bad_inputs_raise_clear_errors(parts):
    graphdef, params = parts
    fns = _segment_fns(graphdef)
    with pytest.raises(ValueError, match="first token"):
        fns.score(params, fns.open(), [1, 2, 3], [1, 1, 1], teacher_logprobs=[0.0] * 3)
    with pytest.raises(ValueError, match="0/1"):
        fns.score(params, fns.open(), [1, 2, 3], [0, 2, 1])
    with pytest.raises(ValueError, match="not both"):
        fns.score(params, fns.open(), [1, 2], [0, 1], teacher_logprobs=[0, 0], token_weights=[1, 1])
    with pytest.raises(ValueError, match="largest bucket"):
        fns.score(params, fns.open(), np.ones(40, np.int32))  # segment longer than 32
    lora_fns = segments.make_segment_fns(graphdef, CFG, SEG_BUCKETS, CACHE_BUCKETS, lora=True)
    with pytest.raises(ValueError, match="base_params"):
        lora_fns.score(params, lora_fns.open(), [1, 2])
