"""One verifier class for convert and the drafters: tensor names are looked up once, by the
names speculators' verifier loader resolves, and a verifier with other names (GPT-2 style
``transformer.wte`` / ``transformer.ln_f``) is refused at convert time, naming what it has."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fixtures_dflash as fd
from cli_runner import invoke


def _gpt2_style(src: Path, out: Path) -> Path:
    """The tiny Qwen3 verifier's tensors under GPT-2 names (tied head: no lm_head tensor)."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True)
    sd = load_file(str(src / "model.safetensors"))
    renamed = {}
    for n, t in sd.items():
        if n == "lm_head.weight":
            continue
        n = (n.replace("model.embed_tokens.", "transformer.wte.").replace("model.norm.", "transformer.ln_f.")
             .replace("model.layers.", "transformer.h."))
        renamed[n] = t
    save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_gpt2_style_verifier_refused_at_convert(tiny_verifier_dir, tmp_path):
    """z-lab DFlash needs no verifier tensor, so this converted with exit 0 before; validate
    then failed to find ``embed_tokens.weight``. Now convert refuses it (exit 3)."""
    v = _gpt2_style(tiny_verifier_dir, tmp_path / "gpt2ish")
    src = fd.make_source(tmp_path / "src", "zlab_dflash")
    out = tmp_path / "out"
    code, rep, err = invoke("convert", src, "--verifier", v, "-o", out).code_json_stderr
    assert code == 3, (rep, err)
    assert rep["error"] == "verifier_tensor_names"
    msg = rep["message"]
    assert "input embedding" in msg and "final norm" in msg
    assert "transformer.wte.weight" in msg and "transformer.ln_f.weight" in msg  # what was found
    assert "transformer.h.0." not in msg  # per-layer tensors are not listed
    assert "embed_tokens.weight" in msg  # what was looked for
    assert not out.exists()


def test_standard_verifier_still_converts(tiny_verifier_dir, tmp_path):
    code, rep, err = invoke("convert", fd.make_source(tmp_path / "src", "zlab_dflash"), "--verifier",
                            tiny_verifier_dir, "-o", tmp_path / "out").code_json_stderr
    assert code == 0, (rep, err)


def test_untied_verifier_without_lm_head_refused(tiny_verifier_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    v = tmp_path / "nohead"
    shutil.copytree(tiny_verifier_dir, v)
    sd = load_file(str(v / "model.safetensors"))
    sd.pop("lm_head.weight")
    save_file(sd, str(v / "model.safetensors"), metadata={"format": "pt"})
    from specconv.errors import InvalidInputError
    from specconv.verifier import resolve_verifier

    with pytest.raises(InvalidInputError, match="LM head") as e:
        resolve_verifier(str(v))
    assert e.value.exit_code == 3 and "model.embed_tokens.weight" in e.value.message


def test_drafter_takes_the_tensors_convert_picks(tiny_verifier_dir, tmp_path):
    """A full-vocab DFlash dir without embed_tokens / lm_head: the reference drafter reads the
    verifier tensors :meth:`Verifier.find_tensor` names (the same object for convert and validate)."""
    import torch

    from specconv.drafters import load_drafter
    from specconv.verifier import resolve_verifier

    out = tmp_path / "out"
    code, rep, err = invoke("convert", fd.make_source(tmp_path / "src", "zlab_dflash"), "--verifier",
                            tiny_verifier_dir, "-o", out).code_json_stderr
    assert code == 0, (rep, err)
    v = resolve_verifier(str(tiny_verifier_dir))
    drafter = load_drafter(out, v)
    assert torch.equal(drafter.embed_tokens, v.read_tensor(v.find_tensor("embed")))
    assert torch.equal(drafter.lm_head.weight, v.read_tensor(v.find_tensor("lm_head")))
    assert v.find_tensor("lm_head") == "lm_head.weight"  # untied tiny verifier
    # a path works too, and gives the same tensors
    again = load_drafter(out, tiny_verifier_dir)
    assert torch.equal(again.lm_head.weight, drafter.lm_head.weight)
