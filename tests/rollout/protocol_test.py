"""Wire encoding, request/result round trips, validation, and the staleness check."""

import numpy as np
import pytest

from thundersync_jax.models import sampling
from thundersync_jax.rollout import protocol, wire
from thundersync_jax.rollout.protocol import EngineLimits, GenerateRequest, RequestError
from thundersync_jax.rollout.staleness import StalePolicyError, check_version

LIMITS = EngineLimits(vocab_size=61, max_seq_len=32)


def test_wire_round_trips_arrays_exactly():
    msg = {
        "op": "x",
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
        "i64": np.array([-(2**40), 5], np.int64),
        "empty": np.zeros((0, 4), np.int32),
        "nested": [{"b": np.array([True, False])}, None, 3, "s"],
    }
    out = wire.decode(wire.encode(msg))
    for k in ("f32", "i64", "empty"):
        assert out[k].dtype == msg[k].dtype and out[k].shape == msg[k].shape
        np.testing.assert_array_equal(out[k], msg[k])
    np.testing.assert_array_equal(out["nested"][0]["b"], [True, False])
    assert out["nested"][1:] == [None, 3, "s"]


def test_wire_rejects_garbage_and_object_arrays():
    with pytest.raises(wire.WireError, match="undecodable frame"):
        wire.decode(b"\xc1\xc1")
    with pytest.raises(wire.WireError, match="string 'op' field"):
        wire.decode(wire.encode({"no_op": 1}))
    forged = wire.encode(
        {"op": "x", "a": {"__ndarray__": True, "dtype": "|O", "shape": [1], "data": b"12345678"}}
    )
    with pytest.raises(wire.WireError, match="object arrays"):
        wire.decode(forged)


def test_request_and_result_round_trip():
    sp = sampling.SamplingParams(
        temperature=0.5, top_p=0.9, max_new_tokens=7, stop_token_ids=(3, 4)
    )
    req = GenerateRequest("r", [1, 2, 3], sp, (1, 2, 3, 4), turn=2)
    back = protocol.request_from_wire(
        wire.decode(wire.encode({"op": "g", "r": protocol.request_to_wire(req)}))["r"]
    )
    assert back == req
    res = protocol.GenerateResult("r", [5, 6], [-0.5, -1.25], "stop", 3)
    assert protocol.result_from_wire(protocol.result_to_wire(res)) == res


@pytest.mark.parametrize(
    ("req", "match"),
    [
        (GenerateRequest("", [1], sampling.SamplingParams(), (0, 0, 0, 0)), "request_id"),
        (GenerateRequest("a", [], sampling.SamplingParams(), (0, 0, 0, 0)), "empty prompt"),
        (GenerateRequest("a", [1] * 32, sampling.SamplingParams(), (0, 0, 0, 0)), "at most 31"),
        (GenerateRequest("a", [-1], sampling.SamplingParams(), (0, 0, 0, 0)), r"\[0, 61\)"),
        (GenerateRequest("a", [1], sampling.SamplingParams(), (0, 0, 0)), "key_ids"),
        (GenerateRequest("a", [1], sampling.SamplingParams(), (0, 0, 0, 2**31)), "key_ids"),
        (GenerateRequest("a", [1], sampling.SamplingParams(), (0, 0, 0, 0), turn=-2), "turn"),
        (
            GenerateRequest("a", [1], sampling.SamplingParams(stop_token_ids=(61,)), (0, 0, 0, 0)),
            "stop",
        ),
    ],
)
def test_validation_names_the_problem(req, match):
    with pytest.raises(RequestError, match=match):
        protocol.validate_request(req, LIMITS)


def test_malformed_wire_requests_are_request_errors():
    good = protocol.request_to_wire(
        GenerateRequest("a", [1], sampling.SamplingParams(), (0, 0, 0, 0))
    )
    with pytest.raises(RequestError, match="missing fields"):
        protocol.request_from_wire({"request_id": "a"})
    with pytest.raises(RequestError, match="1-D integer array"):
        protocol.request_from_wire({**good, "prompt_tokens": np.zeros(2, np.float32)})
    with pytest.raises(RequestError, match="sampling must be a map"):
        protocol.request_from_wire({**good, "sampling": {"temperature": 1.0}})


def test_check_version():
    check_version(4, 4)
    with pytest.raises(
        StalePolicyError, match="version 3 but the learner is at version 4 \\(lag 1\\)"
    ):
        check_version(3, 4, what="trajectory g0/m1")
