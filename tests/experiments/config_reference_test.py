"""One config schema: docs/config.md is generated from it, and a bad key is one clear error."""

import os
import subprocess
import sys

import pytest

from configs import common, cpu
from experiments import config_reference as reference
from thundersync_jax.schedule.config_check import ConfigError, check_keys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_docs_config_md_is_current():
    # A fresh interpreter: tests elsewhere register extra estimators in this one.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-m", "experiments.config_reference"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    with open(os.path.join(ROOT, "docs", "config.md")) as f:
        assert f.read() == out.stdout, (
            "run: python -m experiments.config_reference > docs/config.md"
        )


def test_every_key_has_a_meaning():
    docs = reference.meanings()
    keys = [key for key, _ in reference.leaves(common.get_base_config())]
    assert len(keys) > 80  # the walk really saw the sections
    missing = [key for key in keys if not docs.get(key)]
    assert missing == [], "add `  # meaning` on the key's line in configs/common.py"


def test_valid_values_come_from_the_registries():
    valid = reference.valid_values()
    assert set(valid["schedule"]) == {"sync", "group", "stream", "async"}
    assert "rloo" in valid["rl.advantage"] and "opd" in valid["rl.algorithm"]


def test_an_unknown_key_names_the_key_and_the_valid_ones():
    c = cpu.get_config()
    with c.unlocked():
        c.rl.tis_capp = 2.0
    with pytest.raises(ConfigError, match=r"unknown key rl\.tis_capp; rl has: .*tis_cap"):
        check_keys(c, common.get_base_config())


def test_a_value_of_another_type_names_the_key_and_the_type():
    c = cpu.get_config().to_dict()  # a plain dict, as a config built in code may be
    c["rollout"]["max_turns"] = "8"
    with pytest.raises(ConfigError, match=r"rollout\.max_turns='8' has type str; it must be int"):
        check_keys(c, common.get_base_config())


def test_shipped_configs_have_only_known_keys():
    from configs import b200, h200, terminal_opd_cpu

    for config in (cpu.get_config(), b200.get_config("full"), h200.get_config(),
                   terminal_opd_cpu.get_config("smoke")):  # fmt: skip
        check_keys(config, common.get_base_config())
