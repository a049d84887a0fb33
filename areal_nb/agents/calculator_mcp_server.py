"""The tool task's calculator as a stdio MCP server: `python -m areal_nb.agents.calculator_mcp_server`.

An MCP client (an agent framework) starts this process, lists its one tool, `calculator`, and
sends it the model's calls over stdin/stdout; the server exits when its stdin closes. The tool
is `areal_nb.data.tool_task.calculator`, offered with the exact schema of `CALCULATOR_TOOL`:
the built-in `tiny-tools` model reads the tool's JSON in its prompt and was warm-started on that
one, so the schema the `mcp` package would derive from the signature (with `title` fields) would
be a prompt it has never seen. A server of your own needs none of this: `@server.tool()` on a
typed function is the usual way.
"""

from __future__ import annotations

import copy
from typing import Any, cast

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool

from areal_nb.data.tool_task import CALCULATOR_TOOL, calculator


def _calculator_tool() -> Tool:
    """The calculator as an MCP tool: name, description and input schema of `CALCULATOR_TOOL`;
    its result is plain text (no structured copy beside it)."""
    spec = cast(dict[str, Any], CALCULATOR_TOOL["function"])
    tool = Tool.from_function(
        calculator, name=spec["name"], description=spec["description"], structured_output=False
    )
    return tool.model_copy(update={"parameters": copy.deepcopy(spec["parameters"])})


server = MCPServer("calculator", tools=[_calculator_tool()])

if __name__ == "__main__":
    server.run()  # stdio
