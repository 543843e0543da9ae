"""Chat templates the tests render with (importable by name from every room, like ``cli_runner``).

:data:`THINKING_TEMPLATE` is a reasoning template in Qwen3's style: thinking is on unless
``enable_thinking`` is false, which renders an empty think block after the assistant header
(the switch of Qwen3's own template). SmolLM2's template has no such switch.
"""

THINKING_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")
