"""How ``validate`` and ``release`` render prompts (docs/validate.md, "Chat template"): the three
options, declared once and folded into one ``chat`` argument (a
:class:`specconv.prompts.ChatOptions`). Importing this module imports click only."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

_OPTIONS = (
    click.option("--chat-template", "chat_template", default="auto", show_default=True, metavar="auto|none|FILE",
                 help="auto: the verifier tokenizer's template; none: no template (a base model: plain 'prompt' "
                      "strings, special tokens as the tokenizer adds them; 'messages' prompts refused); FILE: a "
                      "Jinja chat template."),
    click.option("--chat-template-kwargs", "chat_template_kwargs", metavar="JSON",
                 help="Extra template variables as a JSON object, as vLLM's and llama-server's chat_template_kwargs; "
                      "a variable the template never reads is refused."),
    click.option("--thinking", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
                 help="enable_thinking for the template: auto = its default (recorded as what it resolved to); "
                      "on|off is refused when the template never reads enable_thinking."),
)


def chat_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the options above to a command; its callback receives them as one ``chat`` keyword
    (a FILE resolved to an absolute path here, once; ``--chat-template-kwargs`` parsed, exit 2
    when it is not a JSON object). Apply it below ``run_command`` so a refusal is rendered."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from specconv.prompts import ChatOptions, parse_chat_kwargs

        template = kwargs.pop("chat_template")
        if template not in ("auto", "none"):
            template = str(Path(template).absolute())
        chat = ChatOptions(template=template, kwargs=parse_chat_kwargs(kwargs.pop("chat_template_kwargs")),
                           thinking=kwargs.pop("thinking"))
        chat.template_kwargs()  # the flag-only refusals (exit 2), before anything is read
        return fn(*args, chat=chat, **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper
