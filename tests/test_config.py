import pytest

from areal_nb.config import ConfigError, dump_config, load_config


def test_yaml_with_dotted_overrides():
    cfg = load_config("configs/multi_turn_math.yaml", ["actor.lr=1e-5", "rollout.group_size=3", "agent.mode=subproc"])
    assert cfg.actor.lr == 1e-5 and cfg.rollout.group_size == 3 and cfg.agent.mode == "subproc"
    assert cfg.agent.export_style == "concat" and cfg.agent.turn_discount == 0.9  # from the file


def test_mapping_overrides_keep_python_objects():
    class Agent:
        async def run(self, data, **kw):
            return 1.0

    agent = Agent()
    cfg = load_config(None, {"agent.workflow": agent, "agent.workflow_kwargs": {"x": 1}})
    assert cfg.agent.workflow is agent and cfg.agent.workflow_kwargs == {"x": 1}


@pytest.mark.parametrize("override, message", [
    ("actor.lrr=1", "unknown config key 'actor.lrr'; did you mean 'actor.lr'"),
    ("rollout.batch_size=many", "rollout.batch_size: expected an integer"),
    ("rollout.prefetch=3", "rollout.prefetch: expected true/false"),
    ("rollout.group_size=0", "rollout.group_size must be >= 1"),
    ("agent.mode=remote", "agent.mode must be one of"),
    ("rollout.temperature=0.5", "actor.temperature .* must equal rollout.temperature"),
    ("agent.chat_template_type=hf", "export_style='concat' needs"),
    ("actor", "not of the form key=value"),
])
def test_invalid_configs_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/multi_turn_math.yaml", [override])


def test_missing_file_and_round_trip(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    cfg = load_config("configs/multi_turn_math.yaml", ["seed=7"])
    path = tmp_path / "c.yaml"
    dump_config(cfg, path)
    assert load_config(path) == cfg


def test_gpu_variant_loads():
    cfg = load_config("configs/multi_turn_math_qwen1.5b.yaml")
    assert cfg.model.path == "Qwen/Qwen2.5-1.5B-Instruct" and cfg.rollout.group_size == 4
    assert cfg.actor.use_decoupled_loss and cfg.rollout.max_head_offpolicyness == 2
