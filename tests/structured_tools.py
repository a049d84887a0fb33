"""Two small tools for the structured-output tests: with their definitions a prompt still fits
tiny-math's 512-token context."""

SAY = {
    "type": "function",
    "function": {
        "name": "say",
        "parameters": {
            "type": "object",
            "properties": {"w": {"enum": ["hi", "bye"]}},
            "required": ["w"],
            "additionalProperties": False,
        },
    },
}
NUM = {
    "type": "function",
    "function": {
        "name": "num",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["n"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in (SAY, NUM)}
