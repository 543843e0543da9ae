"""Issue 24 item 4: the temp siblings of an output (``.<stem>.tmp-<pid>-<rand>``, its ``.lock``,
``.<stem>.old-…``) leave room for any legal ``-o`` name (up to NAME_MAX, 255 bytes), and the
stale-temp cleanup still finds them, and only them (a name's glob characters are literal).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli_runner import invoke
from fixtures_dflash import HUB, make_source
from specconv.outdir import STEM_MAX, OutputTemp, clean_stale, sibling_stem

NAME_MAX = 255


def _bytes(name: str) -> int:
    return len(os.fsencode(name))


@pytest.mark.parametrize("name", ["o" * 228, "o" * 234, "o" * 255, "é" * 127 + "x"],
                         ids=["228", "234", "255", "255-bytes-utf8"])
def test_every_legal_output_name_converts(tmp_path, tiny_verifier_dir, monkeypatch, name):
    assert _bytes(name) <= NAME_MAX
    seen: list[str] = []
    real = OutputTemp.__init__

    def spy(self, out_dir):
        real(self, out_dir)
        seen.extend(p.name for p in (self.path, self.lock, self.old))

    monkeypatch.setattr(OutputTemp, "__init__", spy)
    out = tmp_path / "work" / name
    r = invoke("convert", make_source(tmp_path / "src"), "--verifier", tiny_verifier_dir, "--verifier-name", HUB,
               "-o", out)
    assert r.code == 0, r.output[-2000:]
    assert (out / "model.safetensors").is_file() and sorted(p.name for p in out.parent.iterdir()) == [name]
    assert len(seen) == 3 and all(_bytes(n) <= NAME_MAX for n in seen), [_bytes(n) for n in seen]


def test_a_long_name_keeps_its_head_and_a_hash_of_the_whole():
    short, long_a, long_b = "o" * STEM_MAX, "a" * 255, "a" * 254 + "b"
    assert sibling_stem(short) == short  # today's names unchanged where they fit
    sa, sb = sibling_stem(long_a), sibling_stem(long_b)
    assert sa != sb and sa.startswith("a" * 150) and sibling_stem(long_a) == sa
    assert _bytes(sa) <= STEM_MAX and _bytes(sibling_stem("é" * 127 + "x")) <= STEM_MAX
    assert sibling_stem("é" * 127 + "x").encode("utf-8")  # whole characters: still valid UTF-8


def test_clean_stale_finds_the_siblings_of_a_long_name_and_only_them(tmp_path):
    name, other = "a" * 255, "a" * 254 + "b"
    out = tmp_path / name
    live = OutputTemp(out)  # a concurrent run's: kept
    assert all(_bytes(p.name) <= NAME_MAX for p in (live.path, live.lock, live.old))
    stale = tmp_path / f".{sibling_stem(name)}.tmp-999999999-abcd1234"  # no such pid, no lock: stale
    stale.mkdir()
    orphan = tmp_path / f".{sibling_stem(name)}.tmp-999999998-abcd1234.lock"
    orphan.write_text("")
    foreign = tmp_path / f".{sibling_stem(other)}.tmp-999999997-abcd1234"  # another output's
    foreign.mkdir()
    assert clean_stale(out) == [stale.name]
    assert not orphan.exists() and foreign.is_dir() and live.path.is_dir() and live.lock.exists()
    live.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == [foreign.name]


def test_clean_stale_reads_glob_characters_in_a_name_literally(tmp_path):
    """``-o 'out[1]'``: its stale temp is removed; the temp of the output ``out1`` (which the
    glob ``.out[1].tmp-*`` matched) is not specconv's to remove for ``out[1]``."""
    own = tmp_path / ".out[1].tmp-999999999-abcd1234"
    own.mkdir()
    not_ours = tmp_path / ".out1.tmp-999999998-abcd1234"
    not_ours.mkdir()
    assert clean_stale(tmp_path / "out[1]") == [own.name]
    assert not own.exists() and not_ours.is_dir()
    assert clean_stale(Path(tmp_path / "out1")) == [not_ours.name]
