"""Agent capture: code from `__main__` becomes agent.py (what it uses and nothing else), importable
code stays an import path, and what cannot travel fails at export time, naming it.

`as_main` runs a script as the `__main__` module (its source is the script file, as for
`python script.py`; in a notebook it is IPython's cell history, exercised by tutorial 5).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import textwrap
import types

import pytest

from areal_nb.config import dump_config, load_config
from areal_nb.export import ExportError
from areal_nb.export.capture import capture_workflow, check_imports

AGENT_CELLS = """
import re, threading
import statistics as stats
from areal_nb import Session

NUMBER = re.compile(r"-?\\d+")
SCALE = {"right": 1.0, "wrong": 0.0}
session = threading.Lock()   # a live object the agent does not use
client = threading.Lock()    # named like the agent's local variable

def last_number_reward(completion, answer):
    numbers = NUMBER.findall(completion)
    return SCALE["right"] if numbers and numbers[-1] == str(answer) else SCALE["wrong"]

def unrelated():
    return session

class Agent:
    def __init__(self, bonus: float = 0.0):
        self.bonus = bonus
        self.session = None  # an attribute, not the global

    async def run(self, data, **kwargs):
        client = object()
        return last_number_reward(data["text"], data["answer"]) + stats.mean([self.bonus])

print("a cell with side effects")
"""


@pytest.fixture
def as_main(tmp_path, monkeypatch):
    def run(source: str) -> types.ModuleType:
        path = tmp_path / "script.py"
        path.write_text(textwrap.dedent(source))
        module = types.ModuleType("__main__")
        module.__file__ = str(path)
        monkeypatch.setitem(sys.modules, "__main__", module)
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
        return module

    return run


def load_agent_py(folder, source):
    (folder / "agent.py").write_text(source)
    spec = importlib.util.spec_from_file_location("exported_agent", folder / "agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.server  # imports the result in a fresh interpreter
def test_a_class_from_cells_becomes_agent_py_with_what_it_uses(as_main, tmp_path, capsys):
    main = as_main(AGENT_CELLS)
    captured = capture_workflow(main.Agent)
    assert captured.workflow == "agent.Agent" and captured.workflow_kwargs is None
    source = captured.source
    for needed in (
        "import re",
        "import statistics as stats",
        "NUMBER = re.compile('-?\\\\d+')",
        "SCALE = {'right': 1.0, 'wrong': 0.0}",
        "def last_number_reward",
        "class Agent:",
    ):
        assert needed in source, needed
    for unused in ("threading", "Session", "def unrelated", "print(", "\nsession ="):
        assert unused not in source, unused
    assert captured.modules == {"re", "statistics"}

    module = load_agent_py(tmp_path, source)
    assert module.last_number_reward("so 12", 12) == 1.0 and module.last_number_reward("13", 12) == 0.0
    dump_config(load_config(None, {"agent.workflow": "agent.Agent"}), tmp_path / "config.yaml")
    check_imports(tmp_path, "agent.Agent")  # a fresh interpreter


def test_a_lambda_closing_over_a_live_object_fails_naming_it(as_main):
    main = as_main("""
        import threading

        def make_reward(lock):
            return lambda completion: float(lock.locked())

        reward = make_reward(threading.Lock())

        class Agent:
            async def run(self, data, **kwargs):
                return reward(data["text"])
        """)
    with pytest.raises(ExportError, match=r"'reward' \(used by 'Agent'\) closes over 'lock' \(lock\)"):
        capture_workflow(main.Agent)


def test_a_global_holding_a_live_object_fails_naming_it(as_main):
    main = as_main("""
        import threading
        LOCK = threading.Lock()
        reward = lambda completion: float(LOCK.locked())

        class Agent:
            async def run(self, data, **kwargs):
                return reward(data["text"])
        """)
    with pytest.raises(ExportError, match=r"'reward' uses the global 'LOCK', a live lock object"):
        capture_workflow(main.Agent)


def test_a_name_the_cells_never_define_fails_naming_it(as_main):
    main = as_main("""
        class Agent:
            async def run(self, data, **kwargs):
                return helper(data)
        """)
    with pytest.raises(ExportError, match=r"'Agent' uses 'helper', which is not defined"):
        capture_workflow(main.Agent)


def test_importable_agents_travel_by_import_path():
    from areal_nb.agents.math_agent import MultiTurnMathAgent

    assert capture_workflow(MultiTurnMathAgent).workflow == "areal_nb.agents.math_agent.MultiTurnMathAgent"
    assert capture_workflow("my.module.Agent").workflow == "my.module.Agent"  # checked when written
    instance = capture_workflow(MultiTurnMathAgent(max_turns=3, reward_timeout=5.0))
    assert instance.workflow == "areal_nb.agents.math_agent.MultiTurnMathAgent"
    assert instance.workflow_kwargs == {"max_turns": 3, "reward_timeout": 5.0}


def test_an_instance_whose_arguments_are_not_plain_data_is_refused(as_main):
    main = as_main("""
        import threading
        class Agent:
            def __init__(self, lock):
                self.lock = lock
            async def run(self, data, **kwargs):
                return 0.0
        agent = Agent(threading.Lock())
        """)
    with pytest.raises(ExportError, match=r"instance of Agent whose argument 'lock'.*pass the class"):
        capture_workflow(main.agent)


def test_the_users_own_module_is_copied_not_required_installed(tmp_path, monkeypatch):
    """`%%writefile my_task_agent.py` beside the notebook, then `from my_task_agent import Agent`:
    the module is the user's, not installed, so the run folder gets a copy."""
    (tmp_path / "my_task_agent.py").write_text(
        "class Agent:\n    async def run(self, data, **kw):\n        return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("my_task_agent")
    captured = capture_workflow(module.Agent)
    assert captured.workflow == "my_task_agent.Agent" and captured.source is None
    assert captured.local_modules() == [tmp_path / "my_task_agent.py"]
    from areal_nb.agents.math_agent import MultiTurnMathAgent

    assert capture_workflow(MultiTurnMathAgent).local_modules() == []  # areal_nb's own: installed


def test_an_agent_built_with_a_reward_function_from_cells_is_rebuilt_in_agent_py(as_main, tmp_path):
    main = as_main("""
        from areal_nb.agents.chat_agent import ChatAgent

        def exact(row, reply):
            return float(reply.strip() == row["answer"])

        agent = ChatAgent(reward_fn=exact, max_turns=2)
        """)
    captured = capture_workflow(main.agent)
    assert captured.workflow == "agent.AGENT" and captured.workflow_kwargs == {}
    assert "from areal_nb.agents.chat_agent import ChatAgent" in captured.source
    assert captured.source.rstrip().endswith("AGENT = ChatAgent(reward_fn=exact, max_turns=2)")
    module = load_agent_py(tmp_path, captured.source)
    assert module.AGENT.max_turns == 2 and module.AGENT.reward_fn({"answer": "4"}, " 4") == 1.0
    # the same through the class and workflow_kwargs
    by_class = capture_workflow(main.ChatAgent, {"reward_fn": main.exact})
    assert by_class.workflow == "agent.AGENT" and "AGENT = ChatAgent(reward_fn=exact)" in by_class.source


def test_a_decorated_reward_from_cells_is_written_with_its_decorator(as_main, tmp_path):
    """`functools.wraps` leaves a closure on the function: agent.py re-runs the decorated def,
    so that closure is rebuilt, not refused."""
    main = as_main("""
        import functools
        from areal_nb.agents.chat_agent import ChatAgent

        def doubled(fn):
            @functools.wraps(fn)
            def inner(row, reply):
                return 2 * fn(row, reply)
            return inner

        @doubled
        def exact(row, reply):
            return float(reply.strip() == row["answer"])

        agent = ChatAgent(reward_fn=exact)
        """)
    captured = capture_workflow(main.agent)
    assert "@doubled\ndef exact(row, reply):" in captured.source and "def doubled(fn):" in captured.source
    module = load_agent_py(tmp_path, captured.source)
    assert module.AGENT.reward_fn({"answer": "4"}, " 4") == 2.0


def test_an_instance_keeps_what_a_subclass_passes_on_through_kwargs(as_main):
    main = as_main("""
        from areal_nb.agents.chat_agent import ChatAgent

        def exact(row, reply):
            return 1.0

        class Strict(ChatAgent):
            def __init__(self, bonus=0.5, **kwargs):
                super().__init__(reward_fn=exact, **kwargs)
                self.bonus = bonus

        agent = Strict(bonus=0.7, max_turns=3)
        agent.retry_prompt = "Once more."   # a ChatAgent argument, set after the agent was made
        agent.calls = 12                    # state, not configuration
        """)
    captured = capture_workflow(main.agent)
    assert captured.workflow == "agent.Strict"
    assert captured.workflow_kwargs == {"bonus": 0.7, "max_turns": 3, "retry_prompt": "Once more."}


def test_an_instance_whose_configuration_cannot_be_rebuilt_fails_naming_it(as_main):
    main = as_main("""
        class Agent:
            def __init__(self, turns=1, temperature=1.0):
                self.turns = turns
                self.temperature = temperature

            async def run(self, data, **kwargs):
                return 0.0

        class Hot(Agent):
            def __init__(self):          # takes nothing on: temperature cannot come back
                super().__init__(turns=2)

        agent = Hot()
        agent.temperature = 0.3
        """)
    with pytest.raises(ExportError, match=r"instance of Hot, holds temperature=0.3 \(rebuilt: 1.0\)"):
        capture_workflow(main.agent)


def test_a_tool_agent_with_tools_from_cells_is_rebuilt_in_agent_py(as_main, tmp_path):
    main = as_main("""
        from areal_nb.agents.tool_agent import ToolAgent

        SCHEMA = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}

        def lookup(city):
            return {"city": city}

        def exact(row, reply):
            return reply == row["answer"]

        agent = ToolAgent(reward_fn=exact, tools={"lookup": (SCHEMA, lookup)}, max_turns=2)
        """)
    captured = capture_workflow(main.agent)
    assert captured.workflow == "agent.AGENT"
    assert (
        "AGENT = ToolAgent(reward_fn=exact, max_turns=2, tools={'lookup': ({'type': 'function'"
        in captured.source
    )
    assert captured.source.rstrip().endswith("lookup)})")
    module = load_agent_py(tmp_path, captured.source)
    assert module.AGENT.call_tool("lookup", '{"city": "Oslo"}') == '{"city": "Oslo"}'
    assert module.AGENT.max_turns == 2 and module.AGENT.reward_fn({"answer": "4"}, "4") is True


def test_the_built_in_tool_agent_exports_with_its_calculator_imported(as_main, tmp_path):
    main = as_main("""
        from areal_nb.agents.tool_agent import ToolAgent

        agent = ToolAgent(max_turns=2)
        """)
    captured = capture_workflow(main.agent)
    assert "from areal_nb.data.tool_task import calculator" in captured.source
    module = load_agent_py(tmp_path, captured.source)
    assert module.AGENT.call_tool("calculator", '{"expression": "6*7"}') == "42"
