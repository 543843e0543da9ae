"""The converter registry is complete: every registered format has a fixture-backed test,
and ``docs/formats.md`` is generated from the registry and up to date.

Rules (docs/adding_a_converter.md):

* a **supported** format ``ID`` needs its test module — ``tests/converters/test_ID.py``, or
  the module named for it in :data:`TEST_MODULES` — that mentions ``ID``, runs a conversion
  (``convert``) and loads the output with speculators 0.9.0 (``load_with_speculators``); the
  conversion and the load may be the parametrised tests of its family's module
  (:data:`FAMILY_MODULES`), which run over every format the registry lists for the family;
* a **refused** format needs a trigger in ``tests/fixtures_dspark.REFUSAL_CASES`` (run by
  ``tests/converters/test_refusals.py``) or a test module as above that mentions ``ID``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fixtures_dflash
import fixtures_dspark
from cli_runner import invoke
from specconv.converters import REGISTRY, ordered

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
DOCS = REPO / "docs" / "formats.md"
#: the algorithms a converter may target: the ones specconv describes (speculators 0.9.0 types)
SPECULATORS_ALGORITHMS = {"peagle", "dflash", "dspark", "dflash2"}

#: format id → test module (relative to tests/) when it is not ``converters/test_<id>.py``
#: (one module covering several formats of the same producer).
TEST_MODULES = {
    "speculators_dflash": "converters/test_speculators_trainer.py",
    "speculators_dspark": "converters/test_speculators_trainer.py",
    "speculators_peagle": "converters/test_speculators_trainer.py",
    "speculators_peagle_early": "converters/test_speculators_trainer.py",
    "speculators_other": "converters/test_speculators_trainer.py",
    "zlab_dflash2": "converters/test_dflash2.py",
    "speculators_dflash2": "converters/test_dflash2.py",
}


#: family test module (relative to tests/) → the formats its parametrised tests convert and
#: load with speculators (fixtures_dflash.registry_formats: the registry's formats of that algorithm).
FAMILY_MODULES = {
    "converters/test_convert_dflash.py": fixtures_dflash.FORMATS,
    "converters/test_convert_dspark.py": fixtures_dspark.FORMATS,
}


def missing_tests(registry, tests_dir: Path = TESTS, modules: dict[str, str] = TEST_MODULES,
                  families: dict[str, tuple[str, ...]] = FAMILY_MODULES) -> list[str]:
    """Return one line per registered format lacking its required test (empty = complete)."""
    from fixtures_dspark import REFUSAL_CASES

    refusal_ids = {fid for _, fid in REFUSAL_CASES}
    problems = []
    for fid, cls in sorted(registry.items()):
        mod = tests_dir / modules.get(fid, f"converters/test_{fid}.py")
        text = mod.read_text() if mod.is_file() else None
        family = "".join((tests_dir / m).read_text() for m, fids in families.items() if fid in fids)
        if not cls.supported:
            if fid not in refusal_ids and (text is None or fid not in text):
                problems.append(f"{fid} (refused): no trigger in tests/fixtures_dspark.REFUSAL_CASES and no "
                                f"{mod.name} naming it")
            continue
        if text is None:
            problems.append(f"{fid}: no tests/{mod.relative_to(tests_dir)} (fixture + end-to-end "
                            "convert + speculators load)")
            continue
        if fid not in text:
            problems.append(f"{fid}: tests/{mod.relative_to(tests_dir)} never mentions {fid!r}")
        if not re.search(r"convert", text + family):
            problems.append(f"{fid}: tests/{mod.relative_to(tests_dir)} runs no conversion")
        if "load_with_speculators" not in text + family:
            problems.append(f"{fid}: tests/{mod.relative_to(tests_dir)} never loads the output with "
                            "speculators (tests/interop.py)")
    return problems


def test_every_registered_format_has_its_tests():
    problems = missing_tests(REGISTRY)
    assert not problems, "registered converters without the required tests:\n  " + "\n  ".join(problems)


def test_missing_tests_check_is_not_vacuous(tmp_path):
    from specconv.converters.base import Converter

    class Fake(Converter):
        format_id = "fake_format_xyz"
        algorithm = "dflash"
        title = "fake"
        detection = "never"

    class FakeRefusal(Fake):
        format_id = "fake_refusal_xyz"
        supported = False
        refusal = "no"

    (tmp_path / "converters").mkdir()
    probs = missing_tests({"fake_format_xyz": Fake, "fake_refusal_xyz": FakeRefusal}, tmp_path, {}, {})
    assert len(probs) == 2 and "fake_format_xyz" in probs[0] + probs[1]
    (tmp_path / "converters" / "test_fake_format_xyz.py").write_text("# fake_format_xyz: convert\n")
    probs = missing_tests({"fake_format_xyz": Fake}, tmp_path, {}, {})
    assert probs == ["fake_format_xyz: tests/converters/test_fake_format_xyz.py never loads the output with "
                     "speculators (tests/interop.py)"]
    (tmp_path / "converters" / "test_family.py").write_text("load_with_speculators\n")
    assert missing_tests({"fake_format_xyz": Fake}, tmp_path, {}, {"converters/test_family.py": ("other",)}) == probs
    assert missing_tests({"fake_format_xyz": Fake}, tmp_path, {},
                         {"converters/test_family.py": ("fake_format_xyz",)}) == []


def test_module_overrides_point_at_registered_formats():
    stale = sorted(set(TEST_MODULES) - set(REGISTRY))
    assert not stale, f"TEST_MODULES names formats that are no longer registered: {stale}"


def test_registry_entries_are_described():
    for cls in REGISTRY.values():
        d = cls.describe()
        assert d["title"] and d["detection"] and d["spec_ref"], cls.format_id
        if cls.supported:
            assert cls.mapping, cls.format_id
            assert set(cls.algorithm.split("|")) <= SPECULATORS_ALGORITHMS, cls.format_id
        else:
            assert cls.refusal, cls.format_id
    from specconv.converters.dispatch import all_ids

    assert [c.format_id for c in ordered()] == all_ids()  # listing order = the detection routes'


def test_every_format_is_reachable_by_a_detection_route():
    from specconv.converters.dispatch import all_ids

    assert sorted(set(all_ids()) - set(REGISTRY)) == [], "routes name unregistered formats"
    assert sorted(set(REGISTRY) - set(all_ids())) == [], "registered formats no detection route reaches"


# --------------------------------------------------------------------------- docs
def _section(text: str, fid: str) -> str:
    m = re.search(rf"^## `{re.escape(fid)}`\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert m, f"docs/formats.md has no section for {fid}"
    return m.group(1)


def test_docs_formats_md_is_generated_and_up_to_date():
    from specconv.cli.formats import formats_markdown

    assert DOCS.is_file(), "docs/formats.md missing: run `specconv formats --markdown > docs/formats.md`"
    assert DOCS.read_text() == formats_markdown(), (
        "docs/formats.md does not match the converter registry: run `specconv formats --markdown > docs/formats.md`"
    )


def test_docs_state_every_format_fact():
    text = DOCS.read_text()
    norm = lambda s: " ".join(str(s).split()).replace("|", "\\|")  # noqa: E731
    for cls in ordered():
        sec = _section(text, cls.format_id)
        assert f"**target algorithm:** {norm(cls.algorithm)}" in sec, cls.format_id
        assert f"**supported:** {'yes' if cls.supported else 'no (refused)'}" in sec, cls.format_id
        assert norm(cls.detection) in sec, cls.format_id
        assert norm(cls.mapping if cls.supported else cls.refusal) in sec, cls.format_id
    # summary table in detection order
    ids = re.findall(r"^\| \d+ \| `([^`]+)` \|", text, flags=re.M)
    assert ids == [c.format_id for c in ordered()]


def test_formats_markdown_cli_prints_the_generated_doc():
    from specconv.cli.formats import formats_markdown

    res = invoke("formats", "--markdown", as_json=False, catch=True)
    assert res.code == 0
    assert res.stdout == formats_markdown()


@pytest.mark.parametrize("fid", ["deepspec_dspark", "specforge_dspark", "modelopt_dspark", "specforge_training"])
def test_dspark_formats_registered(fid):
    assert fid in REGISTRY and REGISTRY[fid].supported


@pytest.mark.parametrize("fid", fixtures_dflash.FORMATS + fixtures_dspark.FORMATS)
def test_family_formats_have_fixture_builders(fid):
    """Every format a family's parametrised tests run over (the registry's) has its spec-built source."""
    if fid in fixtures_dspark.FORMATS:
        assert fid in fixtures_dspark.BUILDERS, f"add {fid} to tests/fixtures_dspark.BUILDERS"
    else:
        fixtures_dflash.source_config(fid)  # ValueError: add the layout to tests/fixtures_dflash.source_config
