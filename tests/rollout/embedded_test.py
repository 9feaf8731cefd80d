"""The embedded continuous-batching engine, in process, against MODEL's batch generator."""

import dataclasses

import jax
import numpy as np
import pytest

from thundersync_jax.models import sampling
from thundersync_jax.rollout import embedded, embedded_programs
from thundersync_jax.rollout.protocol import GenerateRequest, RequestError

ROWS = 3  # fewer rows than requests: rows are refilled while others decode


@pytest.fixture(scope="module")
def model(tiny):
    return tiny.model(seed=4, sharp=True)


@pytest.fixture(scope="module")
def engine(model, tiny):
    return embedded.EmbeddedEngine(model, max_batch=ROWS, max_seq_len=tiny.max_seq_len, version=7)


def _run(engine, requests):
    for req in requests:
        engine.submit(req)
    results, max_active = {}, 0
    while engine.has_work():
        for res in engine.step():
            results[res.request_id] = res
        max_active = max(max_active, engine.stats()["active"])
    return results, max_active


def test_length_buckets_cover_every_prompt():
    assert embedded_programs.length_buckets(64) == (16, 32, 64)
    assert embedded_programs.length_buckets(100) == (16, 32, 64, 100)
    assert embedded_programs.bucket_for(17, (16, 32)) == 32
    with pytest.raises(ValueError, match="exceeds the largest bucket 32"):
        embedded_programs.bucket_for(33, (16, 32))


def test_continuous_batching_matches_the_batch_generator(engine, model, tiny):
    # Prompts <= 16 tokens and max_new_tokens <= 16 keep the reference to one compilation.
    rng = np.random.default_rng(3)
    settings = [(1.0, 1.0, 9), (0.7, 0.8, 14), (0.0, 1.0, 6), (1.3, 1.0, 16)]
    prompts = [rng.integers(0, tiny.cfg.vocab_size, size=1 + 2 * i).tolist() for i in range(8)]
    keys = [(3, 1, i, i % 2) for i in range(8)]

    def reference(i, sp):
        key = sampling.sequence_key(*keys[i])
        return sampling.generate(model, [prompts[i], prompts[i]], [key, key], sp)[0]

    requests = []
    for i in range(8):
        t, p, m = settings[i % 4]
        sp = sampling.SamplingParams(temperature=t, top_p=p, max_new_tokens=m)
        if i == 3:  # stop on the token this request would sample third
            sp = dataclasses.replace(sp, stop_token_ids=(reference(i, sp).tokens[2],))
        requests.append(GenerateRequest(f"r{i}", prompts[i], sp, keys[i]))
    steps_before = engine.stats()["steps"]
    results, max_active = _run(engine, requests)
    assert max_active == ROWS and len(results) == 8
    for i, req in enumerate(requests):
        ref, res = reference(i, req.sampling), results[req.request_id]
        assert res.tokens == ref.tokens and res.finish_reason == ref.finish_reason
        np.testing.assert_allclose(res.logprobs, ref.logprobs, atol=1e-5)
        assert res.policy_version == 7
    assert results["r3"].finish_reason == "stop" and len(results["r3"].tokens) <= 3
    # Rows were refilled: fewer steps than running the 8 requests one after another.
    total_tokens = sum(len(r.tokens) for r in results.values())
    assert engine.stats()["steps"] - steps_before < total_tokens
    # One decode program and one prefill program per prompt bucket.
    assert engine.stats()["compiles"] <= 1 + len(engine.buckets)


def test_a_full_row_ends_with_length(engine, tiny):
    sp = sampling.SamplingParams(max_new_tokens=50)
    prompt = [1] * (tiny.max_seq_len - 3)
    results, _ = _run(engine, [GenerateRequest("full", prompt, sp, (0, 0, 0, 0))])
    assert len(results["full"].tokens) == 3 and results["full"].finish_reason == "length"


def test_cancel_frees_queued_and_running_requests(engine):
    sp = sampling.SamplingParams(max_new_tokens=30)
    reqs = [GenerateRequest(f"c{i}", [1, 2, 3], sp, (0, 0, i, 0)) for i in range(ROWS + 1)]
    for r in reqs:
        engine.submit(r)
    engine.step()  # ROWS requests running, one queued
    assert engine.cancel("c0") and engine.cancel(f"c{ROWS}") and not engine.cancel("nope")
    results, _ = _run(engine, [])
    assert sorted(results) == [f"c{i}" for i in range(1, ROWS)]


def test_score_equals_the_generators_logprobs_at_temperature_one(engine, model):
    # At temperature 1 without top-p the sampled log-probs are the model's own log-softmax.
    sp = sampling.SamplingParams(temperature=1.0, max_new_tokens=11)
    prompts = [[5, 3, 9, 1, 40], [7] * 13]
    keys = [sampling.sequence_key(8, 0, i, 0) for i in range(2)]
    refs = sampling.generate(model, prompts, keys, sp)
    scored = engine.score([p + r.tokens for p, r in zip(prompts, refs, strict=True)])
    for prompt, ref, got in zip(prompts, refs, scored, strict=True):
        assert got.shape == (len(prompt) + len(ref.tokens) - 1,)
        np.testing.assert_allclose(got[len(prompt) - 1 :], ref.logprobs, atol=1e-5)
    with pytest.raises(RequestError, match="token ids outside"):
        engine.score([[1, 99]])


def test_submit_validates(engine, tiny):
    with pytest.raises(RequestError, match="empty prompt"):
        engine.submit(GenerateRequest("e", [], sampling.SamplingParams(), (0, 0, 0, 0)))


def test_lora_adapter_snapshots_are_served_merged_into_the_base(model, engine, tmp_path):
    from flax import nnx

    from thundersync_jax.models import lora
    from thundersync_jax.rollout import snapshots

    base = nnx.split(model, nnx.Param)[1]
    targets = ("q_proj", "down_proj")
    adapters = lora.init(base, 2, 4.0, targets, key=jax.random.key(1))
    adapters = jax.tree.map(lambda x: x + 0.01, adapters)  # B != 0: a visible update
    path = snapshots.publish(adapters, 1, str(tmp_path), kind="lora_adapters")
    with pytest.raises(snapshots.SnapshotError, match="started without LoRA"):
        engine.load_weights(path, 1)
    lora_engine = embedded.EmbeddedEngine(
        model, max_batch=1, max_seq_len=16, lora=(2, 4.0, targets)
    )
    lora_engine.load_weights(path, 1)
    assert lora_engine.version == 1
    want = jax.tree.leaves(lora.merge(base, adapters))
    got = jax.tree.leaves(lora_engine.params)
    assert any(not np.allclose(w, b) for w, b in zip(want, jax.tree.leaves(base), strict=True))
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-7)


def test_a_request_samples_the_same_alone_or_prefilled_with_others(engine, tiny):
    # Prefill runs each admitted prompt on its own, so co-admitted prompts (and the row the
    # request lands in) change nothing, to the bit.
    rng = np.random.default_rng(11)
    sp = sampling.SamplingParams(temperature=0.9, max_new_tokens=7)
    target = GenerateRequest(
        "x", rng.integers(0, tiny.cfg.vocab_size, 13).tolist(), sp, (5, 0, 1, 0)
    )
    alone, _ = _run(engine, [target])
    others = [
        GenerateRequest(
            f"o{i}", rng.integers(0, tiny.cfg.vocab_size, 9 + i).tolist(), sp, (5, 0, 2 + i, 0)
        )
        for i in range(ROWS - 1)
    ]
    together, _ = _run(engine, [*others, target])  # admitted in the same step, in the last row
    assert together["x"].tokens == alone["x"].tokens
    assert together["x"].logprobs == alone["x"].logprobs
