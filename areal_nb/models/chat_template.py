"""The ChatML chat template of `tiny-math` (Qwen2.5-style tools and tool calls).

Every message renders as `<|im_start|>{role}\\n{content}<|im_end|>\\n` with exactly one
`<|im_end|>` per message: the concat-mode token alignment counts EOS tokens per turn.
Unlike Qwen2.5 there is no default system prompt, and consecutive tool results are not merged.
"""

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

CHAT_TEMPLATE = (
    # Content may be a string, None, or a list of {"type": "text", "text": ...} parts.
    "{%- macro render_content(content) -%}"
    "{%- if content is none -%}"
    "{%- elif content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part is string -%}{{ part }}"
    "{%- elif part.type == 'text' -%}{{ part.text }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{- render_content(messages[0].content) + '\\n\\n' -}}"
    "{%- endif -%}"
    "{{- " + repr(TOOLS_PREAMBLE) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- " + repr(TOOLS_POSTAMBLE) + " + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and tools and message.role == 'system' -%}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + render_content(message.content)"
    " + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' and message.tool_calls -%}"
    "{%- set text = render_content(message.content) -%}"
    "{{- '<|im_start|>assistant\\n' + text -}}"
    "{%- for call in message.tool_calls -%}"
    "{%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}"
    "{%- if text or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' -}}'
    "{%- if call.arguments is string -%}{{- call.arguments -}}"
    "{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content)"
    " + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
