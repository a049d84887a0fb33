import pytest
import yaml

from areal_nb.config import ConfigError, dump_config, load_config


def test_yaml_with_dotted_overrides():
    cfg = load_config(
        "configs/multi_turn_math.yaml", ["actor.lr=1e-5", "rollout.group_size=3", "agent.mode=subproc"]
    )
    assert cfg.actor.lr == 1e-5 and cfg.rollout.group_size == 3 and cfg.agent.mode == "subproc"
    assert cfg.agent.export_style == "concat" and cfg.agent.turn_discount == 0.9  # from the file


def test_mapping_overrides_keep_python_objects():
    class Agent:
        async def run(self, data, **kw):
            return 1.0

    agent = Agent()
    cfg = load_config(None, {"agent.workflow": agent, "agent.workflow_kwargs": {"x": 1}})
    assert cfg.agent.workflow is agent and cfg.agent.workflow_kwargs == {"x": 1}


@pytest.mark.parametrize(
    "override, message",
    [
        ("actor.lrr=1", "unknown config key 'actor.lrr'; did you mean 'actor.lr'"),
        ("rollout.batch_size=many", "rollout.batch_size: expected an integer"),
        ("rollout.prefetch=3", "rollout.prefetch: expected true/false"),
        ("rollout.group_size=0", "rollout.group_size must be >= 1"),
        ("agent.mode=remote", "agent.mode must be one of"),
        # the trainer's temperature is rollout.temperature; an old file that sets its own is told so
        ("actor.temperature=0.5", "actor.temperature is no longer a config key: .* rollout.temperature"),
        ("actor.lora.dropout=0.1", "actor.lora.dropout is no longer a config key"),
        ("agent.chat_template_type=hf", "Cannot export interactions in 'concat' style"),
        ("actor", "not of the form key=value"),
    ],
)
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


def test_one_seed_seeds_the_data_and_the_engine_unless_they_are_given_their_own():
    cfg = load_config(None, ["seed=7"])
    assert (cfg.seed, cfg.data.seed, cfg.engine.seed) == (7, 7, 7)
    own = load_config(None, ["seed=7", "data.seed=0", "engine.seed=3"])
    assert (own.data.seed, own.engine.seed) == (0, 3)
    # a copy with another run seed: what followed the old one follows the new one, the rest stays
    again = load_config(load_config(None, ["seed=7", "data.seed=0"]), ["seed=2"])
    assert (again.seed, again.data.seed, again.engine.seed) == (2, 0, 2)
    # the demo's file seeds its problems apart (data.seed 0) and its engine with the run (seed 1)
    demo = load_config("configs/multi_turn_math.yaml")
    assert (demo.seed, demo.data.seed, demo.engine.seed) == (1, 0, 1)


def test_a_config_saved_before_keys_were_removed_still_loads(tmp_path):
    # Checkpoints and run folders of earlier releases wrote actor.temperature (then required to
    # equal rollout.temperature) and lora.dropout (0.0, which never ran): they load as they were.
    cfg = load_config("configs/multi_turn_math.yaml", ["rollout.temperature=0.7", "actor.lora.r=4"])
    saved = yaml.safe_load(dump_config(cfg))
    saved["actor"]["temperature"] = 0.7
    saved["actor"]["lora"]["dropout"] = 0.0
    saved["agents"] = {"solver": {"lora": {"r": 2, "dropout": 0.0}}}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(saved))
    old = load_config(path, ["agents={}"])
    assert old == cfg
    assert load_config(path, ["actor.lora=null"]).agents["solver"].lora.r == 2
    # a value the code does not follow any more is still refused, naming the key that replaced it
    with pytest.raises(
        ConfigError, match="actor.temperature is no longer a config key: .* rollout.temperature"
    ):
        load_config(path, ["actor.temperature=1.0", "agents={}"])
    with pytest.raises(ConfigError, match="actor.lora.dropout is no longer a config key"):
        load_config(path, ["actor.lora.dropout=0.1", "agents={}"])


def test_gpu_variant_loads():
    cfg = load_config("configs/multi_turn_math_qwen1.5b.yaml")
    assert cfg.model.path == "Qwen/Qwen2.5-1.5B-Instruct" and cfg.rollout.group_size == 4
    assert cfg.actor.use_decoupled_loss and cfg.rollout.max_head_offpolicyness == 2
    assert cfg.engine.type == "sglang" and cfg.engine.launch.command == "sglang"
    assert cfg.engine.launch.mem_fraction_static == 0.5


def test_engine_server_settings():
    cfg = load_config(
        None,
        [
            "engine.type=remote",
            "engine.addresses=[http://10.0.0.2:30000,http://10.0.0.3:30000]",
            "engine.api_key=k",
            "engine.weights_dir=/shared/weights",
        ],
    )
    assert cfg.engine.addresses == ["http://10.0.0.2:30000", "http://10.0.0.3:30000"]
    assert (cfg.engine.api_key, cfg.engine.weights_dir) == ("k", "/shared/weights")
    launch = load_config(
        None,
        {
            "engine.type": "sglang",
            "engine.launch.command": ["my-server", "--port", "{port}"],
            "engine.launch.n_servers": 2,
            "engine.launch.ports": [30000, 30001],
        },
    ).engine.launch
    assert launch.command == ["my-server", "--port", "{port}"] and launch.ports == [30000, 30001]
    assert (launch.host, launch.tp_size, launch.dp_size, launch.ready_timeout) == ("127.0.0.1", 1, 1, 600.0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["engine.type=remote"], "engine.type=remote needs engine.addresses"),
        (
            ["engine.addresses=[http://h:1]"],
            "engine.addresses is only read with engine.type=remote (engine.type is 'local')",
        ),
        (
            ["engine.type=sglang", "engine.launch.n_servers=2", "engine.launch.ports=[30000]"],
            "engine.launch.ports lists 1 ports for n_servers=2",
        ),
        (["engine.type=vllm"], "engine.type must be one of 'local', 'sglang' or 'remote', got 'vllm'"),
        (["engine.launch.n_server=2"], "did you mean 'engine.launch.n_servers'?"),
    ],
)
def test_engine_server_settings_errors(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value)


def test_experiment_name_names_the_default_run_dir():
    cfg = load_config("configs/multi_turn_math.yaml", ["experiment_name=exp-7"])
    assert str(cfg.run_dir) == "runs/exp-7"
    assert str(load_config(None, ["logging.run_dir=/tmp/elsewhere"]).run_dir) == "/tmp/elsewhere"


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "logging.backend=mlflow",
            "logging.backend must be one of 'none', 'tensorboard' or 'wandb', got 'mlflow'",
        ),
        ("rollout.batch_size=abc", "rollout.batch_size: expected an integer, got 'abc'"),
        ("rollout.batch_size=2.5", "rollout.batch_size: expected an integer, got 2.5"),
        ("actor.lr=abc", "actor.lr: expected a number, got 'abc'"),
        ("agent.discount_mode=flat", "agent.discount_mode must be one of 'tree' or 'linear'"),
        ("actor.kl_estimator=k9", "actor.kl_estimator must be one of 'k1', 'k2' or 'k3', got 'k9'"),
        ("actor.parallel=zero3", "actor.parallel must be one of 'ddp' or 'fsdp', got 'zero3'"),
        ("actor.lr=0", r"actor.lr must be > 0.0, got 0"),
        (
            "data.task.max_operandd=3",
            "unknown config key 'data.task.max_operandd'; did you mean 'data.task.max_operand'",
        ),
        ("agent.subproc_max_workers=0", "agent.subproc_max_workers must be >= 1, got 0"),
        (
            "rollout.max_concurrent_rollouts=2",
            r"max_concurrent_rollouts \(2\) must be >= rollout.group_size \(8\)",
        ),
    ],
)
def test_errors_name_the_key_and_the_value(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/multi_turn_math.yaml", [override])


def test_values_are_checked_on_assignment_too():
    from pydantic import ValidationError

    cfg = load_config(None)
    cfg.rollout.batch_size = 4
    with pytest.raises(ValidationError, match="batch_size"):
        cfg.rollout.batch_size = "four"


def test_engine_defaults_are_the_same_through_config_command_line_and_constructor():
    # One source (areal_nb/engine/defaults.py, admission.py): a literal reintroduced in any door fails here.
    import inspect

    from areal_nb.cli.engine_server import build_parser
    from areal_nb.config import EngineConfig
    from areal_nb.engine.local import LocalEngine
    from areal_nb.engine.server_app import EngineServerSettings

    args = build_parser().parse_args([])
    constructor = inspect.signature(LocalEngine.__init__).parameters
    config = EngineConfig()
    for name in ("max_batch_size", "prefix_cache_tokens"):
        assert getattr(args, name) == getattr(config, name) == constructor[name].default, name
    # the threading differs on purpose: a hand-started server is alone on its machine, a Session's
    # engine shares it with agents and the proxy (both from engine/defaults.py)
    from areal_nb.engine.defaults import DEFAULT_SERVER_SINGLE_THREAD_ROWS, DEFAULT_SINGLE_THREAD_ROWS

    assert args.single_thread_rows == DEFAULT_SERVER_SINGLE_THREAD_ROWS
    assert (
        config.single_thread_rows == constructor["single_thread_rows"].default == DEFAULT_SINGLE_THREAD_ROWS
    )
    assert args.admission_max_wait == EngineServerSettings().admission_max_wait


def test_the_proxy_session_timeout_is_the_same_through_config_command_line_and_settings():
    from areal_nb.cli.proxy import build_parser
    from areal_nb.config import AgentConfig
    from areal_nb.proxy.settings import ProxySettings

    assert (
        build_parser().parse_args([]).session_timeout
        == AgentConfig().session_timeout
        == ProxySettings().session_timeout
    )
