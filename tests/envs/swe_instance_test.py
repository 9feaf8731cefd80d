"""SWE-bench JSONL records: both encodings of the test lists, defaults, clear errors."""

import json

import pytest

from thundersync_jax.envs.swe import instance as instance_lib

RECORD = {
    "instance_id": "o__r-1",
    "repo": "o/r",
    "base_commit": "abc",
    "problem_statement": "bug",
    "patch": "P",
    "test_patch": "T",
    "FAIL_TO_PASS": '["t.py::a", "t.py::b[x y]"]',
    "PASS_TO_PASS": ["t.py::c", "t.py::a"],
    "created_at": "2024",
}


def test_from_dict_decodes_json_strings_and_keeps_extras():
    inst = instance_lib.SweInstance.from_dict(RECORD)
    assert inst.fail_to_pass == ("t.py::a", "t.py::b[x y]")
    assert inst.pass_to_pass == ("t.py::c", "t.py::a")
    assert inst.test_ids == ("t.py::a", "t.py::b[x y]", "t.py::c")  # no duplicates
    assert inst.test_cmd == "python -m pytest -q -p no:cacheprovider"
    assert inst.env == {} and inst.repo_path == ""
    assert inst.extra == {"created_at": "2024"}
    assert instance_lib.SweInstance.from_dict(inst.to_dict()) == inst
    empty = instance_lib.SweInstance.from_dict({**RECORD, "PASS_TO_PASS": "", "patch": None})
    assert empty.pass_to_pass == () and empty.patch == ""


@pytest.mark.parametrize(
    "change, message",
    [
        ({"FAIL_TO_PASS": "t.py::a"}, "FAIL_TO_PASS is a string but not a JSON list"),
        ({"PASS_TO_PASS": [1]}, "PASS_TO_PASS must be a list of test ids"),
        ({"env": ["A=1"]}, "env must be an object"),
        ({"FAIL_TO_PASS": "[]", "PASS_TO_PASS": []}, "both empty"),
    ],
)
def test_bad_fields(change, message):
    with pytest.raises(ValueError, match=message):
        instance_lib.SweInstance.from_dict({**RECORD, **change})


def test_missing_field_is_named():
    record = {k: v for k, v in RECORD.items() if k != "test_patch"}
    with pytest.raises(ValueError, match=r"o__r-1: missing field\(s\) \['test_patch'\]"):
        instance_lib.SweInstance.from_dict(record)


def test_jsonl_round_trip_and_errors(tmp_path):
    path = tmp_path / "i.jsonl"
    inst = instance_lib.SweInstance.from_dict({**RECORD, "repo_path": "/abs/repo", "env": {"A": 1}})
    instance_lib.dump_jsonl([inst], str(path))
    assert instance_lib.load_jsonl(str(path)) == [
        instance_lib.SweInstance.from_dict({**RECORD, "repo_path": "/abs/repo", "env": {"A": "1"}})
    ]
    path.write_text(json.dumps(RECORD) + "\n\n" + json.dumps(RECORD) + "\n")
    with pytest.raises(ValueError, match=r"duplicate instance_id\(s\) \['o__r-1'\]"):
        instance_lib.load_jsonl(str(path))
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match="i.jsonl:1: not valid JSON"):
        instance_lib.load_jsonl(str(path))


def test_load_predictions_jsonl_and_json_list(tmp_path):
    preds = [{"instance_id": "a", "model_patch": "X"}, {"instance_id": "b", "model_patch": None}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(p) for p in preds) + "\n")
    (tmp_path / "p.json").write_text(json.dumps(preds))
    for name in ("p.jsonl", "p.json"):
        assert instance_lib.load_predictions(str(tmp_path / name)) == {"a": "X", "b": ""}
    (tmp_path / "bad.jsonl").write_text('{"model_patch": "X"}\n')
    with pytest.raises(ValueError, match="needs instance_id"):
        instance_lib.load_predictions(str(tmp_path / "bad.jsonl"))
