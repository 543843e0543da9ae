"""Resolve once, pass down (issue 15 item 3): one ``specconv validate --source`` run resolves
the verifier once and hands that same :class:`~specconv.verifier.Verifier` to the source's
conversion and every step after it, and parses the drafter dir's ``config.json`` once into
the typed config that G1 and the drafter loader then receive.

Counted with monkeypatches around the real functions (``resolve_verifier``,
``specconv.format.schema.read_config``, which ``load_config`` / ``lint_dir`` /
``speculators_model_type_of`` all read through), on a real run: the tiny SmolLM2-tokenizer
verifier and the z-lab DFlash drafter of ``tests/test_validate_cli.py``, all four gates.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("dflash")

from cli_runner import invoke  # noqa: E402


@pytest.mark.slow
def test_validate_source_resolves_the_verifier_once_and_parses_the_config_once(validate_set_copy, tmp_path,
                                                                               monkeypatch):
    import specconv.convert as convert_mod
    import specconv.format as fmt
    import specconv.format.schema as schema
    import specconv.verifier as verifier_mod
    from specconv.cli.validate import validate_cmd

    b = validate_set_copy
    drafter_config = (b["spec"] / "config.json").resolve()
    resolved, converted_with, parsed = [], [], []
    real_resolve, real_convert, real_read = verifier_mod.resolve_verifier, convert_mod.convert, schema.read_config

    def resolve(*a, **kw):
        resolved.append(real_resolve(*a, **kw))
        return resolved[-1]

    def convert(source, *, verifier, **kw):
        converted_with.append(verifier)
        return real_convert(source, verifier=verifier, **kw)

    def read_config(path):
        p = Path(path)
        if ((p / "config.json") if p.is_dir() else p).resolve() == drafter_config:
            parsed.append(path)
        return real_read(path)

    monkeypatch.setattr(verifier_mod, "resolve_verifier", resolve)
    monkeypatch.setattr(convert_mod, "convert", convert)
    monkeypatch.setattr(schema, "read_config", read_config)
    monkeypatch.setattr(fmt, "read_config", read_config, raising=False)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = invoke(b["spec"], "--verifier", b["verifier"], "--source", b["zlab"], "--prompts", b["prompts"],
                   "--num-prompts", "1", "--max-new-tokens", "4", "--device", "cpu", "--report-dir",
                   tmp_path / "report",
                   command=validate_cmd)
    finally:
        torch.set_num_threads(n)
    assert r.code == 0, r.output[-3000:]
    assert '"parity": true' in r.output  # the source was converted and compared (G2 ran)
    assert len(resolved) == 1, f"resolve_verifier called {len(resolved)} times in one validate --source run"
    assert len(converted_with) == 1 and converted_with[0] is resolved[0]  # the source converted with the same object
    assert len(parsed) == 1, f"the drafter's config.json was parsed {len(parsed)} times"
