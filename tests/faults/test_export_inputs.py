"""`areal-nb export` and the config's overrides under hostile input: every value YAML cannot read,
every boolean where a count goes, every malformed key, every bad path — exit 2 with the CLI's own
`areal-nb export: ...` line naming the override, no traceback, nothing written."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_nb.cli.export import main
from areal_nb.config import ConfigError, SessionConfig, _numeric, _resolved_field_types, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "multi_turn_math.yaml"

UNREADABLE = [
    "@handle",
    "%x",
    "[unclosed",
    '"unclosed',
    "*alias",
    "!!python/object/apply:os.system ['id']",
    "{unclosed",
    "'unclosed",
    "`tick",
    "&anchor [",
    "a: b: c",
    "!!binary ===",
    "[" * 3000,
    "!!python/name:os.system",
    "- a\n- b: [",
    "? complex key",
]


def numeric_keys() -> list[str]:
    """Every int or float field of the config tree, by its dotted key (sections walked)."""
    keys = []

    def walk(node, prefix):
        for name, annotation in _resolved_field_types(node).items():
            if _numeric(annotation):
                keys.append(prefix + name)
            elif isinstance(annotation, type) and (
                dataclasses.is_dataclass(annotation) or issubclass(annotation, SessionConfig.__mro__[1])
            ):
                walk(annotation, f"{prefix}{name}.")

    walk(SessionConfig, "")
    return keys


def run(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("value", UNREADABLE, ids=lambda v: repr(v[:24]))
def test_each_value_yaml_cannot_read_exits_2_naming_the_override(capsys, tmp_path, value):
    override = f"experiment_name={value}"
    code, err = run(capsys, CONFIG, override, "--out", tmp_path / "run")
    if code == 2 and "YAML cannot read" in err:
        shown = override if len(override) <= 120 else override[:120] + "..."
        assert err.startswith(f"areal-nb export: override {shown!r}") and "Traceback" not in err, err
    else:  # YAML read it as some value, which the config then judged
        assert code == 2 and err.startswith("areal-nb export: ") and "experiment_name" in err, err
    assert list(tmp_path.iterdir()) == []


def test_the_issue_s_six_values_are_each_named_unreadable(capsys, tmp_path):
    for value in UNREADABLE[:6]:
        code, err = run(capsys, CONFIG, f"experiment_name={value}", "--out", tmp_path / "run")
        assert code == 2 and f"YAML cannot read the value {value!r}" in err, err


@pytest.mark.parametrize("value", ["true", "false", "yes", "on"])
def test_a_boolean_is_never_a_number(value):
    # every numeric key in one test (a test item per key cost more than the loads themselves)
    wrong = {}
    for key in numeric_keys():
        try:
            load_config(CONFIG, [f"{key}={value}"])
            wrong[key] = "accepted"
        except ConfigError as exc:
            if not re.match(
                rf"^{key}: expected an? (integer|number), got (true|false) \(a boolean", str(exc)
            ):
                wrong[key] = str(exc)
    assert not wrong, wrong


def test_every_numeric_field_is_covered():
    keys = numeric_keys()
    assert {
        "cluster.nodes",
        "total_steps",
        "actor.lr",
        "rollout.batch_size",
        "engine.launch.n_servers",
        "data.task.max_operand" if any(k.startswith("data.task.") for k in keys) else "data.seed",
    } <= set(keys)


@pytest.mark.parametrize(
    "override",
    ["=3", ".x=1", "a..b=1", "rollout.=2", "novalue", " =1", "total_steps.x=1", "rollout=3", "no_such_key=1"],
)
def test_malformed_keys_exit_2(capsys, tmp_path, override):
    code, err = run(capsys, CONFIG, override, "--out", tmp_path / "run")
    assert code == 2 and err.startswith("areal-nb export: ") and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_paths_the_user_gives_are_the_user_s_errors(capsys, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    cases = [
        ([CONFIG, "--out", a_file / "sub"], f"{a_file} is a file, not a folder"),
        ([CONFIG, "--out", a_file / "sub" / "deeper"], f"{a_file} is a file, not a folder"),
        ([tmp_path / "missing.yaml", "--out", tmp_path / "run"], "config file not found"),
        ([tmp_path, "--out", tmp_path / "run"], "cannot be read"),  # a folder as the config
        ([CONFIG, "data.source=" + str(a_file / "x.jsonl"), "--out", tmp_path / "run"], "is not a file"),
    ]
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    cases.append(([binary, "--out", tmp_path / "run"], str(binary)))
    broken = tmp_path / "broken.yaml"
    broken.write_text("total_steps: [1, 2\n")
    cases.append(([broken, "--out", tmp_path / "run"], "not readable YAML (line 2"))
    for args, message in cases:
        code, err = run(capsys, *args)
        assert code == 2 and message in err and "Traceback" not in err, (args, err)
    assert a_file.read_text() == "mine" and not (tmp_path / "run").exists()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key=st.sampled_from(
        [
            "experiment_name",
            "total_steps",
            "cluster.nodes",
            "cluster.time",
            "actor.lr",
            "cluster.partition",
            "model.path",
            "rollout.temperature",
            "agent.mode",
        ]
    ),
    value=st.text(min_size=0, max_size=40),
)
def test_any_override_text_is_a_config_or_a_config_error(key, value):
    """Whatever text follows `key=`, loading either gives a config or a ConfigError: never another
    exception (which the CLI would print as a traceback)."""
    try:
        load_config(CONFIG, [f"{key}={value}"])
    except ConfigError as exc:
        assert str(exc)


@pytest.mark.server
def test_the_real_command_prints_no_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for value in UNREADABLE[:6]:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "areal_nb.cli",
                "export",
                str(CONFIG),
                f"experiment_name={value}",
                "--out",
                str(tmp_path / "run"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"areal-nb export: override {'experiment_name=' + value!r}"), (
            done.stderr
        )
        assert "Traceback" not in done.stderr
