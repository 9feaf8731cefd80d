"""A real rollout server process: streaming, publication, keyed determinism, bad requests."""

import itertools
import time

import numpy as np
import pytest
import zmq
from flax import nnx

from thundersync_jax.models import sampling
from thundersync_jax.rollout import protocol, snapshots, wire
from thundersync_jax.rollout.protocol import EngineError, GenerateRequest

_versions = itertools.count(1)


def _request(rid, prompt, key=(0, 0, 0, 0), **sp):
    params = sampling.SamplingParams(**{"temperature": 1.0, "max_new_tokens": 12, **sp})
    return GenerateRequest(rid, list(prompt), params, key)


def _reference(model, req):
    """MODEL's batch generator: an independent implementation of the same keyed sampling."""
    key = sampling.sequence_key(*req.key_ids)
    return sampling.generate(model, [req.prompt_tokens], [key], req.sampling)[0]


def _publish(client, model, root):
    version = next(_versions)
    path = snapshots.publish(nnx.split(model, nnx.Param)[1], version, str(root))
    assert client.load_weights(path, version) == version
    return version


@pytest.fixture(scope="module")
def snapshot_root(tmp_path_factory):
    return tmp_path_factory.mktemp("snapshots")


def test_results_stream_per_request_and_match_the_reference(server, tiny):
    _, client = server
    assert client.health()["version"] == -1  # never-published initial weights
    short = _request("short", [3, 1, 4], key=(0, 0, 1, 0), max_new_tokens=1)
    long = _request("long", [2, 7, 1, 8, 2, 8], key=(0, 0, 2, 0), max_new_tokens=16)
    arrivals = {}
    got = []
    for res in client.generate([long, short]):
        arrivals[res.request_id] = time.monotonic()
        got.append(res)
    assert [r.request_id for r in got] == ["short", "long"]  # each sent as soon as it finished
    model = tiny.model()
    for res, req in ((got[0], short), (got[1], long)):
        ref = _reference(model, req)
        assert res.ok and res.policy_version == -1
        assert res.tokens == ref.tokens and res.finish_reason == ref.finish_reason == "length"
        np.testing.assert_allclose(res.logprobs, ref.logprobs, atol=1e-5)


def test_published_version_is_on_the_next_outputs(server, snapshot_root, tiny):
    _, client = server
    new_model = tiny.model(seed=11, sharp=True)
    version = _publish(client, new_model, snapshot_root)
    assert client.health()["version"] == version
    req = _request("after-publish", [5, 9, 2, 6], key=(1, 2, 3, 4), max_new_tokens=16)
    (res,) = client.generate([req])
    assert res.policy_version == version
    ref = _reference(new_model, req)
    assert res.tokens == ref.tokens != _reference(tiny.model(seed=12, sharp=True), req).tokens
    np.testing.assert_allclose(res.logprobs, ref.logprobs, atol=1e-5)


def test_same_key_same_tokens_alone_or_mixed_into_a_batch(server, tiny):
    _, client = server
    target = _request("alone", [4, 4, 2, 9, 1], key=(7, 3, 5, 2), max_new_tokens=20, top_p=0.9)
    (alone,) = client.generate([target])
    # More requests than cache rows: the target waits for a free row, lands in another row, and
    # shares its decode steps (and a prefill) with different prompts and sampling parameters.
    others = [
        _request(
            f"o{i}",
            np.arange(1 + 5 * i) % tiny.cfg.vocab_size,
            key=(7, 3, i, 0),
            max_new_tokens=3 + 4 * i,
        )
        for i in range(5)
    ]
    twin = GenerateRequest("mixed", target.prompt_tokens, target.sampling, target.key_ids)
    mixed = {r.request_id: r for r in client.generate(others + [twin])}
    assert len(mixed) == 6 and all(r.ok for r in mixed.values())
    assert mixed["mixed"].tokens == alone.tokens
    # Same arithmetic per row; a tolerance only in case a CPU's GEMM treats rows differently.
    np.testing.assert_allclose(mixed["mixed"].logprobs, alone.logprobs, rtol=1e-6, atol=1e-6)
    # A different member is a different key: different tokens.
    other_member = GenerateRequest("m1", target.prompt_tokens, target.sampling, (7, 3, 5, 3))
    (res,) = client.generate([other_member])
    assert res.tokens != alone.tokens
    # A turn index changes the key too, deterministically.
    turn = GenerateRequest("t1", target.prompt_tokens, target.sampling, target.key_ids, turn=1)
    (t1,) = client.generate([turn])
    again = GenerateRequest("t1b", target.prompt_tokens, target.sampling, target.key_ids, turn=1)
    (t1_again,) = client.generate([again])
    assert t1.tokens == t1_again.tokens != alone.tokens


def _raw_roundtrip(address, message, expect):
    """Sends one raw frame from a separate (misbehaving) client; returns the decoded replies."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send(message if isinstance(message, bytes) else wire.encode(message))
        replies = []
        for _ in range(expect):
            assert sock.poll(30_000), "the server did not answer"
            replies.append(wire.decode(sock.recv()))
        return replies
    finally:
        sock.close()


def test_bad_requests_get_clear_errors_and_the_server_stays_up(server, tiny):
    _, client = server
    bad = [
        _request("empty", []),
        _request("too-long", [1] * tiny.max_seq_len),
        _request("bad-token", [1, tiny.cfg.vocab_size]),
        _request("bad-key", [1, 2], key=(0, -1, 0, 0)),
        _request("bad-stop", [1, 2], stop_token_ids=(tiny.cfg.vocab_size + 3,)),
    ]
    results = {r.request_id: r for r in client.generate(bad)}
    assert all(r.finish_reason == "error" and not r.tokens for r in results.values())
    assert "empty prompt" in results["empty"].error
    assert "over-long" in results["too-long"].error and "at most 63" in results["too-long"].error
    assert "[0, 61)" in results["bad-token"].error
    assert "key_ids" in results["bad-key"].error
    assert "stop_token_ids" in results["bad-stop"].error

    # Invalid sampling parameters can only come from a client that skips SamplingParams' checks.
    wire_req = protocol.request_to_wire(_request("neg-temp", [1, 2]))
    wire_req["sampling"]["temperature"] = -1.0
    wire_req2 = protocol.request_to_wire(_request("zero-top-p", [1, 2]))
    wire_req2["sampling"]["top_p"] = 0.0
    replies = _raw_roundtrip(
        client.address, {"op": "generate", "requests": [wire_req, wire_req2]}, 2
    )
    errors = {r["result"]["request_id"]: r["result"]["error"] for r in replies}
    assert "temperature" in errors["neg-temp"] and "top_p" in errors["zero-top-p"]
    _raw_roundtrip(client.address, b"\x93not msgpack at all", 0)
    (reply,) = _raw_roundtrip(client.address, {"op": "explode", "call_id": 1}, 1)
    assert not reply["ok"] and "unknown op 'explode'" in reply["error"]
    with pytest.raises(EngineError, match="need 2..64"):
        client.score([[1]])

    (ok,) = client.generate([_request("still-up", [1, 2, 3], max_new_tokens=3)])
    assert ok.ok and len(ok.tokens) == 3


def test_score_equals_the_sampled_logprobs_at_temperature_one(server, tiny):
    _, client = server
    req = _request("to-score", [6, 1, 7, 3], key=(2, 0, 0, 1), max_new_tokens=10)
    (res,) = client.generate([req])
    scored = client.score([req.prompt_tokens + res.tokens, [1, 2]])
    assert scored[0].shape == (len(req.prompt_tokens) + len(res.tokens) - 1,)
    np.testing.assert_allclose(scored[0][len(req.prompt_tokens) - 1 :], res.logprobs, atol=1e-5)
    assert scored[1].shape == (1,)


def test_score_turns_from_the_servers_episode_cache_equal_full_prefix_scores(server, tiny):
    """The teacher's incremental path through the real server process: an episode's turns in
    order (only new tokens forwarded there), then release; the same numbers as `score`."""
    _, client = server
    tokens = np.asarray([5, 3, 8, 1, 9, 2, 7, 4, 6, 3, 2], np.int32)
    spans = [(1, 4), (6, 8), (9, 11)]
    turns = [dict(episode="ep", tokens=tokens[:e], start=s, end=e) for s, e in spans]
    got = client.score_turns(turns[:1]) + client.score_turns(turns[1:])
    (full,) = client.score([tokens])
    for (s, e), lp in zip(spans, got, strict=True):
        np.testing.assert_allclose(lp, full[s - 1 : e - 1], atol=1e-5)
    assert client.release_episodes(["ep"]) == 0
    with pytest.raises(Exception, match="turns must be scored in order"):
        client.score_turns(turns[:1] + turns[:1])


def test_timed_out_request_is_cancelled_and_frees_its_row(server, tiny):
    _, client = server
    (res,) = client.generate([_request("slow", [1, 2], max_new_tokens=50)], timeout_s=0.0)
    assert res.finish_reason == "error" and "timed out" in res.error
    deadline = time.monotonic() + 30
    while (h := client.health())["active"] or h["queued"]:
        assert time.monotonic() < deadline, h
        time.sleep(0.05)


def test_bad_snapshots_are_refused_and_the_old_weights_kept(server, snapshot_root, tmp_path, tiny):
    _, client = server
    before = client.health()["version"]
    path = snapshots.publish({"w": np.zeros((3, 5), np.float32)}, 99, str(tmp_path))
    with pytest.raises(EngineError, match="different parameter tree"):
        client.load_weights(path, 99)
    with pytest.raises(EngineError, match="holds version 99, expected 98"):
        client.load_weights(path, 98)
    with pytest.raises(EngineError, match="no snapshot at"):
        client.load_weights(str(tmp_path / "v7"), 7)
    assert client.health()["version"] == before
    (ok,) = client.generate([_request("after-bad-load", [1, 2], max_new_tokens=2)])
    assert ok.ok and ok.policy_version == before


def test_load_is_a_barrier_between_versions(server, snapshot_root, tiny):
    _, client = server
    before = client.health()["version"]
    early = _request("early", [1, 2, 3], key=(5, 0, 0, 0), max_new_tokens=16)
    late = _request("late", [1, 2, 3], key=(5, 0, 0, 0), max_new_tokens=16)
    version = next(_versions)
    path = snapshots.publish(
        nnx.split(tiny.model(seed=13, sharp=True), nnx.Param)[1], version, str(snapshot_root)
    )
    results = {}
    client.submit([early], lambda r: results.__setitem__(r.request_id, r))
    ack = client.call_async(protocol.OP_LOAD_WEIGHTS, path=path, version=version)
    client.submit([late], lambda r: results.__setitem__(r.request_id, r))
    assert ack.result(timeout=60)["version"] == version
    deadline = time.monotonic() + 60
    while len(results) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert results["early"].policy_version == before  # admitted before the load: old weights
    assert results["late"].policy_version == version  # held until the load, then new weights
    assert results["late"].tokens == _reference(tiny.model(seed=13, sharp=True), late).tokens
