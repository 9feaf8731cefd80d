"""Score-gradient chunks on the real Qwen3: vs torch autograd, packing, per-turn sums, compiles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from thundersync_jax import accumulators
from thundersync_jax.learner import buckets, chunks
from thundersync_jax.models import lora, qwen3

# Prime-sized dims so a transposed axis cannot go unnoticed.
CFG = qwen3.Qwen3Config(
    vocab_size=37,
    hidden_size=22,
    intermediate_size=26,
    num_hidden_layers=1,  # each layer adds compile time; one exercises every weight kind
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=10,
)
SEQ_BUCKETS = (16, 32)


@pytest.fixture(scope="module")
def model_parts():
    # Random values on the abstract tree: eager init would compile one program per op.
    graphdef, abstract = nnx.split(
        nnx.eval_shape(lambda: qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))), nnx.Param
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), abstract)
    return graphdef, params


@pytest.fixture(scope="module")
def score_grad(model_parts):
    return chunks.make_score_grad_fn(model_parts[0], SEQ_BUCKETS)


def _assert_trees_close(x, y, rtol=1e-4, atol=1e-5):
    assert jax.tree.structure(x) == jax.tree.structure(y)
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def _tree_sum(*trees):
    return jax.tree.map(lambda *xs: sum(np.asarray(x, np.float64) for x in xs), *trees)


def test_packed_weighted_rows_match_torch_autograd(model_parts, score_grad, tmp_path):
    """Three trajectories of one slot packed as rows, per-token weights (OPD-style Â_t)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    graphdef, params = model_parts
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, CFG.vocab_size, (3, 13))
    mask = np.zeros((3, 13), np.float32)
    mask[0, 4:13] = 1  # row 0: 4 prompt tokens, 9 completion tokens
    mask[1, 6:10] = 1  # row 1: shorter, then right padding
    tokens[1, 10:] = 0
    mask[2, 1:5] = 1  # row 2: a one-token prompt
    weights = rng.normal(size=(3, 13)).astype(np.float32)

    h, n = score_grad(params, tokens, mask, weights)
    assert n == 17

    qwen3.save_pretrained(nnx.merge(graphdef, params), str(tmp_path))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    ids = torch.tensor(tokens)
    logp = torch.log_softmax(ref(ids).logits[:, :-1].double(), dim=-1)
    picked = torch.gather(logp, 2, ids[:, 1:, None])[..., 0]
    (picked * torch.tensor(mask * weights)[:, 1:]).sum().backward()
    ours = qwen3.to_hf_state_dict(h, CFG)
    ref_grads = dict(ref.named_parameters())
    assert set(ours) == set(ref_grads)
    for name, g in ours.items():
        assert g.dtype == np.float32
        np.testing.assert_allclose(
            g, ref_grads[name].grad.numpy(), rtol=2e-3, atol=2e-5, err_msg=name
        )


def test_tempered_gradient_matches_torch_and_the_sampler_logprobs(model_parts, tmp_path):
    """Rollouts at temperature T < 1 stay on-policy: the learner differentiates
    log_softmax(logits / T), checked against transformers in float64, and its log-probs of
    sampled tokens are the ones `sampling.sample_token` reports for them."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from thundersync_jax.models import sampling

    graphdef, params = model_parts
    temperature = 0.6
    fn = chunks.make_score_grad_fn(graphdef, SEQ_BUCKETS, temperature=temperature)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, CFG.vocab_size, (2, 11))
    mask = np.zeros((2, 11), np.float32)
    mask[:, 3:] = 1
    h, _ = fn(params, tokens, mask)
    h_untempered, _ = chunks.make_score_grad_fn(graphdef, SEQ_BUCKETS)(params, tokens, mask)

    qwen3.save_pretrained(nnx.merge(graphdef, params), str(tmp_path))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    ids = torch.tensor(tokens)
    logits = ref(ids).logits[:, :-1].double()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    (torch.gather(logp, 2, ids[:, 1:, None])[..., 0] * torch.tensor(mask)[:, 1:]).sum().backward()
    ours = qwen3.to_hf_state_dict(h, CFG)
    moved = False
    for name, param in ref.named_parameters():
        np.testing.assert_allclose(
            ours[name], param.grad.numpy(), rtol=2e-3, atol=2e-5, err_msg=name
        )
    for a, b in zip(jax.tree.leaves(h), jax.tree.leaves(h_untempered), strict=True):
        moved |= not np.allclose(np.asarray(a), np.asarray(b), rtol=1e-2, atol=1e-4)
    assert moved, "the temperature did not change the gradient"

    # The sampler's reported log-prob of a token = the learner's tempered log-prob of it.
    last = jnp.asarray(logits[:, -1].detach().numpy(), jnp.float32)
    keys = jax.vmap(lambda i: jax.random.key(i))(jnp.arange(2))
    toks, tok_logp = sampling.sample_token(last, keys, jnp.full((2,), temperature), jnp.ones((2,)))
    learner_logp = jax.nn.log_softmax(chunks.tempered(last, temperature), axis=-1)
    np.testing.assert_allclose(
        np.asarray(tok_logp), np.asarray(learner_logp)[np.arange(2), np.asarray(toks)], rtol=1e-5
    )


def test_packed_rows_equal_sum_of_single_rows(model_parts, score_grad):
    _, params = model_parts
    rng = np.random.default_rng(2)
    rows = [rng.integers(1, CFG.vocab_size, n).tolist() for n in (9, 14, 5)]
    masks = [[0.0] * 3 + [1.0] * (len(r) - 3) for r in rows]
    weights = [[1.0 / (len(r) - 3)] * len(r) for r in rows]  # seq-mean-token-mean: w_j = 1/n_j
    tokens, mask, w = buckets.pack_sequences(rows, masks, weights)
    h_packed, n_packed = score_grad(params, tokens, mask, w)
    singles = [
        score_grad(params, [r], [m], [wr]) for r, m, wr in zip(rows, masks, weights, strict=True)
    ]
    assert n_packed == sum(n for _, n in singles) == 6 + 11 + 2
    _assert_trees_close(h_packed, _tree_sum(*(h for h, _ in singles)))


def test_per_turn_gradients_sum_to_trajectory_gradient(model_parts, score_grad):
    """OPD per-turn mode: forward over the prefix, loss on that turn's tokens only."""
    _, params = model_parts
    rng = np.random.default_rng(3)
    trajectory = rng.integers(1, CFG.vocab_size, 30)
    # prompt [0,4), turn 1 [4,11), tool output [11,17), turn 2 [17,24), tool output, turn 3 [26,30)
    turns = [(4, 11), (17, 24), (26, 30)]
    adv = rng.normal(size=30).astype(np.float32)
    full_mask = np.zeros(30, np.float32)
    per_turn = []
    for start, end in turns:
        full_mask[start:end] = 1
        turn_mask = np.zeros(end, np.float32)
        turn_mask[start:end] = 1
        per_turn.append(
            score_grad(params, trajectory[None, :end], turn_mask[None], adv[None, :end])
        )
    h_full, n_full = score_grad(params, trajectory[None], full_mask[None], adv[None])
    assert n_full == sum(n for _, n in per_turn) == 7 + 7 + 4
    _assert_trees_close(h_full, _tree_sum(*(h for h, _ in per_turn)))


def test_bfloat16_params_give_float32_gradients(model_parts, score_grad):
    _, params = model_parts
    fn = score_grad
    tokens = np.arange(1, 12)[None] % CFG.vocab_size
    mask = np.ones_like(tokens, np.float32)
    mask[0, 0] = 0
    h32, _ = fn(params, tokens, mask)
    h16, _ = fn(jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), tokens, mask)
    assert {x.dtype for x in jax.tree.leaves(h16)} == {jnp.dtype(jnp.float32)}
    # bf16 keeps ~3 significant digits; compare the gradient direction.
    a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(h32)])
    b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(h16)])
    assert np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.99


def test_compiles_stay_bounded_across_lengths_and_rows(model_parts):
    graphdef, params = model_parts
    fn = chunks.make_score_grad_fn(graphdef, (8, 24))
    rng = np.random.default_rng(4)
    for length in range(2, 25):
        tokens = rng.integers(0, CFG.vocab_size, (1, length))
        mask = np.ones((1, length), np.float32)
        mask[:, 0] = 0
        fn(params, tokens, mask)
    assert fn.compiles == 2  # one per sequence bucket; rows are bucketed too (buckets_test)


def test_remat_gives_the_same_gradient(model_parts, score_grad):
    graphdef, params = model_parts
    fn = chunks.make_score_grad_fn(graphdef, SEQ_BUCKETS, remat=True)
    tokens = np.random.default_rng(5).integers(0, CFG.vocab_size, (1, 20))
    mask = np.ones((1, 20), np.float32)
    mask[0, :5] = 0
    _assert_trees_close(fn(params, tokens, mask)[0], score_grad(params, tokens, mask)[0])
    # The switch reaches the model: each decoder layer is a rematerialized block.
    padded = buckets.pad_chunk(tokens, mask, None, SEQ_BUCKETS)[:3]
    jaxpr = jax.make_jaxpr(fn._score_grad)(params, None, *padded)
    remat_blocks = [e for e in jaxpr.jaxpr.eqns if e.primitive.name.startswith("remat")]
    assert len(remat_blocks) == CFG.num_hidden_layers


def test_lora_chunk_gradient_is_adapter_shaped_and_follows_chain_rule(model_parts, score_grad):
    graphdef, params = model_parts
    adapters = lora.init(params, rank=2, alpha=4.0, key=jax.random.key(0))
    rng = np.random.default_rng(6)
    adapters = jax.tree.map(lambda x: rng.normal(0, 0.2, x.shape).astype(np.float32), adapters)
    fn = chunks.make_score_grad_fn(graphdef, SEQ_BUCKETS, lora=True)
    tokens = rng.integers(0, CFG.vocab_size, (1, 12))
    mask = np.ones((1, 12), np.float32)
    mask[0, :2] = 0
    h, n = fn(adapters, tokens, mask, base_params=params)
    assert n == 10
    assert jax.tree.structure(h) == jax.tree.structure(adapters)
    # Accumulator tallies built on the adapters are adapter-shaped (the base is never copied).
    acc = accumulators.grpo(num_groups=2, group_size=2, max_open_groups=1)
    tallies = jax.eval_shape(acc.init, adapters)
    assert jax.tree.structure(tallies.total) == jax.tree.structure(adapters)
    assert jax.tree.map(lambda x: x.shape[1:], tallies.plain) == jax.tree.map(jnp.shape, adapters)
    # Chain rule from the full-weight score gradient at the merged weights.
    h_full, _ = score_grad(jax.jit(lora.merge)(params, adapters), tokens, mask)
    path = "layers/0/mlp/up_proj/kernel"
    g = np.asarray(h_full["layers"][0]["mlp"]["up_proj"]["kernel"][...], np.float64)
    a, b = (np.asarray(adapters.weights[path][k], np.float64) for k in ("a", "b"))
    np.testing.assert_allclose(h.weights[path]["a"], 2.0 * g @ b.T, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(h.weights[path]["b"], 2.0 * a.T @ g, rtol=1e-3, atol=1e-5)


def test_clear_errors(model_parts, score_grad):
    graphdef, params = model_parts
    ok = np.zeros((1, 5), np.float32)
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        score_grad(params, np.ones((1, 40), np.int32), np.zeros((1, 40)))
    with pytest.raises(ValueError, match=r"loss_mask\[:, 0\]"):
        score_grad(params, np.ones((1, 5), np.int32), np.ones((1, 5)))
    with pytest.raises(ValueError, match="only 0 and 1"):
        score_grad(params, np.ones((1, 5), np.int32), ok + np.array([0, 0.5, 1, 1, 1]))
    with pytest.raises(ValueError, match="base_params"):
        chunks.make_score_grad_fn(graphdef, SEQ_BUCKETS, lora=True)(params, [[1, 2]], [[0, 1]])
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            chunks.make_score_grad_fn(graphdef, SEQ_BUCKETS, temperature=bad)
