"""``--overwrite`` replaces only what specconv wrote (``specconv.outdir.check_replaceable``).

``convert``, ``export onnx``, ``build-engine --overwrite`` and ``release`` (its own
``WORK/drafter``) refuse, exit 3, a home dir holding ``.ssh/`` (``-o ~``), the cwd holding a
user's project (``-o "$PWD"``), a dir of user files, a symlink to one and a specconv output a
user added a file to: the message names the path and what was found, and every byte of the
user's dir is as it was. An empty dir and specconv's own earlier output are replaced.
``-o ~`` / ``-o "$PWD"`` run through bash, so the shell expands them as it would for a user.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import invoke, release_argv
from fixtures_dflash import HUB, cli_convert, make_source

PY = sys.executable


# ----------------------------------------------------------------------------- helpers
def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` and ``root`` itself, symlinks not followed: a file's mode
    and sha256, a dir's mode, a symlink's target."""
    out: dict[str, tuple] = {}

    def visit(p: str, rel: str) -> None:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", st.st_mode)
            for n in sorted(os.listdir(p)):
                visit(os.path.join(p, n), f"{rel}/{n}")
        else:
            out[rel] = ("file", st.st_mode, hashlib.sha256(Path(p).read_bytes()).hexdigest())

    visit(str(root), ".")
    return out


def leftovers(parent: Path) -> list[str]:
    """Temp / backup dirs and locks a writer may leave next to an output."""
    return sorted(p.name for p in Path(parent).iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def _shell(cmd: str, *, cwd: Path, home: Path, **names) -> tuple[int, dict]:
    """``cmd`` run by bash (``$PY`` = this interpreter, ``~`` = ``home``, ``names`` exported)."""
    env = {**os.environ, "HOME": str(home), "PY": PY, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           **{k: str(v) for k, v in names.items()}}
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def _refused(code: int, obj: dict, path: Path, *found: str) -> None:
    """Exit 3 whose message names ``path`` and each of ``found``, and never suggests
    ``--overwrite`` (which would be refused too)."""
    assert code == 3 and obj["error"] == "output_exists", obj
    assert str(path) in obj["message"] and "nothing was touched" in obj["message"], obj
    assert "--overwrite" not in obj["message"] + obj.get("hint", ""), obj
    for f in found:
        assert f in obj["message"], (f, obj)


@pytest.fixture
def home(tmp_path) -> Path:
    """A user's home: an ssh key, a shell rc, notes."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".ssh" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n")
    os.chmod(h / ".ssh" / "id_rsa", 0o600)
    (h / ".ssh" / "known_hosts").write_text("github.com ssh-ed25519 AAAA\n")
    (h / ".bashrc").write_text("export EDITOR=vi\n")
    (h / "notes").mkdir()
    (h / "notes" / "todo.md").write_text("- back up .ssh\n")
    return h


@pytest.fixture
def project(tmp_path) -> Path:
    """A user's project dir (its README.md is the user's, not a card)."""
    p = tmp_path / "project"
    (p / "data").mkdir(parents=True)
    (p / "main.py").write_text("print('hi')\n")
    (p / "README.md").write_text("# my project\n")
    (p / "data" / "train.jsonl").write_text('{"text": "x"}\n')
    return p


# ----------------------------------------------------------------------------- convert
CONVERT_SH = ('"$PY" -m specconv.cli.main convert "$SRC" --verifier "$VER" --verifier-name ' + HUB
              + ' -o {out} --overwrite --format json')


@pytest.fixture
def conversion(tmp_path, tiny_verifier_dir) -> Path:
    """A real conversion output (config, weights, specconv.json, README.md)."""
    out = tmp_path / "converted"
    code, obj, _ = cli_convert(make_source(tmp_path / "src0"), tiny_verifier_dir, out)
    assert code == 0, obj
    return out


@pytest.mark.slow
def test_convert_o_home_is_refused(tmp_path, home, tiny_verifier_dir):
    before = snapshot(home)
    code, obj = _shell(CONVERT_SH.format(out="~"), cwd=tmp_path, home=home,
                       SRC=make_source(tmp_path / "src"), VER=tiny_verifier_dir)
    _refused(code, obj, home, ".ssh/", "no specconv.json")
    assert snapshot(home) == before and leftovers(tmp_path) == []


@pytest.mark.slow
def test_convert_o_pwd_is_refused(tmp_path, home, project, tiny_verifier_dir):
    before = snapshot(project)
    code, obj = _shell(CONVERT_SH.format(out='"$PWD"'), cwd=project, home=home,
                       SRC=make_source(tmp_path / "src"), VER=tiny_verifier_dir)
    _refused(code, obj, project, "main.py", "data/", "README.md")
    assert snapshot(project) == before and leftovers(tmp_path) == []


#: with --overwrite, and without it (the first error must not suggest an --overwrite that is refused)
OVERWRITE = pytest.mark.parametrize("flags", [("--overwrite",), ()], ids=["overwrite", "plain"])


@OVERWRITE
@pytest.mark.parametrize("how", ["user dir", "symlink to a user dir", "symlink to home"])
def test_convert_refuses_a_user_dir_or_a_symlink_to_one(tmp_path, home, project, tiny_verifier_dir, how, flags):
    target = home if how == "symlink to home" else project
    out = target if how == "user dir" else tmp_path / "link"
    if out != target:
        out.symlink_to(target, target_is_directory=True)
    before = snapshot(target)
    code, obj, _ = cli_convert(make_source(tmp_path / "src"), tiny_verifier_dir, out, *flags)
    _refused(code, obj, out, ".ssh/" if target == home else "main.py")
    if out != target:
        assert f"a symlink to {target}" in obj["message"] and out.is_symlink()
    assert snapshot(target) == before and leftovers(tmp_path) == []


@OVERWRITE
@pytest.mark.parametrize("added", ["notes.txt", "onnx/", "trt/"])
def test_convert_refuses_its_own_output_with_a_user_entry_added(tmp_path, conversion, tiny_verifier_dir, added, flags):
    """The record lists what specconv wrote; anything else is named (onnx/ and trt/ are
    judged as an ONNX export / engine dir: a user's dir by those names is refused too)."""
    p = conversion / added.rstrip("/")
    if added.endswith("/"):
        p.mkdir()
        (p / "mine.bin").write_bytes(b"\x00user bytes")
    else:
        p.write_text("my notes\n")
    before = snapshot(conversion)
    code, obj, _ = cli_convert(make_source(tmp_path / "src"), tiny_verifier_dir, conversion, *flags)
    _refused(code, obj, conversion, added, "does not list")
    assert snapshot(conversion) == before and leftovers(tmp_path) == []


def test_convert_replaces_an_empty_dir_and_its_own_earlier_output(tmp_path, conversion, tiny_verifier_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, obj, _ = cli_convert(make_source(tmp_path / "src"), tiny_verifier_dir, empty, "--overwrite")
    assert code == 0, obj
    assert sorted(p.name for p in empty.iterdir()) == ["README.md", "config.json", "model.safetensors", "specconv.json"]
    old = (conversion / "model.safetensors").read_bytes()
    code, obj, _ = cli_convert(make_source(tmp_path / "src1", seed=1), tiny_verifier_dir, conversion, "--overwrite")
    assert code == 0, obj
    assert (conversion / "model.safetensors").read_bytes() != old  # the new conversion's weights
    assert leftovers(tmp_path) == []


def test_convert_replaces_a_symlink_to_its_own_output_and_keeps_the_target(tmp_path, conversion, tiny_verifier_dir):
    link = tmp_path / "link"
    link.symlink_to(conversion, target_is_directory=True)
    before = snapshot(conversion)
    code, obj, _ = cli_convert(make_source(tmp_path / "src1", seed=1), tiny_verifier_dir, link, "--overwrite")
    assert code == 0, obj
    assert not link.is_symlink() and (link / "specconv.json").is_file()  # the link is replaced, not followed
    assert snapshot(conversion) == before and leftovers(tmp_path) == []


# --------------------------------------------------------------------- export onnx
try:  # the export / engine / release cases need the onnx extra; convert's do not
    import importlib.util

    from test_export_wrappers import make_case

    HAVE_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime", "onnxscript"))
except pytest.skip.Exception:
    HAVE_ONNX = False
torch_needed = pytest.mark.skipif(not HAVE_ONNX, reason="needs torch and the onnx extra")
EXPORT_ARGS = ("--dtype", "float32", "--max-context", "16", "--no-check")


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, verifier_dir) -> Path:
    """A tiny P-EAGLE Speculators dir, no export yet."""
    root = tmp_path_factory.mktemp("drafter")
    make_case("peagle-qwen3-pruned", root, verifier_dir)
    return root / "peagle-qwen3-pruned"


@pytest.fixture(scope="module")
def exported(tmp_path_factory, drafter, verifier_dir) -> Path:
    """The drafter with ``onnx/`` exported over an empty ``onnx/`` (an empty dir is replaced)."""
    d = tmp_path_factory.mktemp("exported") / "drafter"
    shutil.copytree(drafter, d)
    (d / "onnx").mkdir()
    code, obj = invoke("export", "onnx", d, "--verifier", verifier_dir, *EXPORT_ARGS, "--overwrite").code_json
    assert code == 0, obj
    assert (d / "onnx" / "onnx_meta.json").is_file() and (d / "onnx" / "drafter.onnx").is_file()
    return d


EXPORT_SH = '"$PY" -m specconv.cli.main export onnx "$DRAFTER" -o {out} --overwrite --format json'


@pytest.mark.slow
@torch_needed
def test_export_o_home_and_o_pwd_are_refused(tmp_path, home, project, drafter):
    before = snapshot(home), snapshot(project)
    code, obj = _shell(EXPORT_SH.format(out="~"), cwd=tmp_path, home=home, DRAFTER=drafter)
    _refused(code, obj, home, ".ssh/", "no onnx_meta.json")
    code, obj = _shell(EXPORT_SH.format(out='"$PWD"'), cwd=project, home=home, DRAFTER=drafter)
    _refused(code, obj, project, "main.py", "data/")
    assert (snapshot(home), snapshot(project)) == before and leftovers(tmp_path) == []


@torch_needed
@OVERWRITE
@pytest.mark.parametrize("how", ["user dir", "symlink to a user dir", "a conversion",
                                 *(pytest.param(h, marks=pytest.mark.slow)  # they take a real export
                                   for h in ("export + user file", "export + user file in fp32/"))])
def test_export_refuses_what_is_not_its_own_export(tmp_path, project, drafter, conversion, request, how, flags):
    if how == "user dir":
        out, target, found = project, project, "main.py"
    elif how == "symlink to a user dir":
        out, target, found = tmp_path / "link", project, "main.py"
        out.symlink_to(project, target_is_directory=True)
    elif how == "a conversion":  # specconv's, but another kind
        out, target, found = conversion, conversion, "no onnx_meta.json"
    else:
        out = target = tmp_path / "o"
        shutil.copytree(request.getfixturevalue("exported") / "onnx", out)
        name = "notes.txt" if how == "export + user file" else "fp32/notes.txt"
        (out / name).parent.mkdir(exist_ok=True)  # a float32 export has no fp32/ twin: the user made it
        (out / name).write_text("mine\n")
        found = "notes.txt" if how == "export + user file" else "fp32/"  # the unlisted entry is named
    before = snapshot(target)
    code, obj = invoke("export", "onnx", drafter, "-o", out, *EXPORT_ARGS, *flags).code_json
    _refused(code, obj, out, found)
    assert snapshot(target) == before and leftovers(tmp_path) == []


@pytest.mark.slow
@torch_needed
def test_export_replaces_its_own_earlier_export(tmp_path, exported, verifier_dir):
    d = tmp_path / "drafter"
    shutil.copytree(exported, d)
    meta = json.loads((d / "onnx" / "onnx_meta.json").read_text())
    code, obj = invoke("export", "onnx", d, "--verifier", verifier_dir, *EXPORT_ARGS, "--overwrite").code_json
    assert code == 0, obj
    new = json.loads((d / "onnx" / "onnx_meta.json").read_text())
    assert new["format"] == "specconv-onnx-drafter" and new["files"].keys() == meta["files"].keys()
    assert leftovers(d) == []


# -------------------------------------------------------------------- build-engine
KEY = "trt11.4.0-cu13-sm90-fp32"  # the fake TensorRT 11.4.0 on the fake sm90 GPU, fp32 graph


@pytest.fixture
def engine_env(monkeypatch, tmp_path, exported):
    """A copy of the export with one engine variant already built by the fake TensorRT."""
    from test_build_engine import GPU, fake_trt

    from specconv.engines.tensorrt import build as engine

    monkeypatch.setattr(engine, "gpu_info", lambda: GPU)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_trt([]))
    d = tmp_path / "drafter"
    shutil.copytree(exported, d)
    code, obj = invoke("build-engine", d).code_json
    assert code == 0 and obj["key"] == KEY, obj
    return d


@pytest.mark.slow
@torch_needed
@OVERWRITE
@pytest.mark.parametrize("how", ["user dir", "symlink to home", "variant + user file"])
def test_build_engine_overwrite_refuses_what_is_not_its_own_variant(engine_env, home, project, how, flags):
    out = engine_env / "trt" / KEY
    if how == "variant + user file":
        target, found = out, "notes.txt"
        (out / found).write_text("mine\n")
    else:
        shutil.rmtree(out)
        target, found = (project, "main.py") if how == "user dir" else (home, ".ssh/")
        if how == "user dir":
            shutil.copytree(project, out)
            target = out
        else:
            out.symlink_to(home, target_is_directory=True)
    before, trt_before = snapshot(target), snapshot(engine_env / "trt")
    code, obj = invoke("build-engine", engine_env, *flags).code_json
    _refused(code, obj, out, found)
    assert snapshot(target) == before and snapshot(engine_env / "trt") == trt_before


@pytest.mark.slow
@torch_needed
@pytest.mark.parametrize("how", ["empty dir", "earlier variant", "earlier variant, build.json without files"])
def test_build_engine_overwrite_replaces_an_empty_dir_or_its_own_variant(engine_env, how):
    out = engine_env / "trt" / KEY
    build = json.loads((out / "build.json").read_text())
    assert build["files"] == ["build.json", "drafter.plan"]
    if how == "empty dir":
        shutil.rmtree(out)
        out.mkdir()
    elif how.endswith("without files"):  # built before build.json listed its files
        del build["files"]
        (out / "build.json").write_text(json.dumps(build))
    code, obj = invoke("build-engine", engine_env, "--overwrite").code_json
    assert code == 0, obj
    assert sorted(p.name for p in out.iterdir()) == ["build.json", "drafter.plan"]
    assert json.loads((out / "build.json").read_text())["files"] == ["build.json", "drafter.plan"]
    assert leftovers(out.parent) == []


# ------------------------------------------------------------------------- release
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2-dflash-b8"
TOKEN = "hf_specconvFAKEtoken0123456789abcdef"
RELEASE_REPO = "specconv-test/overwrite"


@pytest.fixture(scope="module")
def double():
    pytest.importorskip("torch")
    from hub_double import HubDouble

    d = HubDouble(token=TOKEN).start()
    yield d
    d.stop()


def _hub_env(double) -> dict[str, str]:
    return {"HF_ENDPOINT": double.url, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1"}


@pytest.mark.parametrize("how", ["user dir with an onnx/onnx_meta.json", "symlink to home",
                                 "conversion + user file"])
def test_release_checks_its_work_dir_drafter_before_moving_anything(double, smollm2_dir, tmp_path, home, how):
    """``--export-onnx`` used to move ``WORK/drafter/onnx`` aside (and delete
    ``WORK/.previous-export``) before the ownership check."""
    work = tmp_path / "work"
    drafter = work / "drafter"
    if how.startswith("user dir"):
        (drafter / "onnx").mkdir(parents=True)
        (drafter / "onnx" / "onnx_meta.json").write_text('{"mine": true}\n')
        (drafter / "paper.tex").write_text("\\section{x}\n")
        target, found = drafter, "paper.tex"
    elif how == "symlink to home":
        work.mkdir()
        drafter.symlink_to(home, target_is_directory=True)
        target, found = home, ".ssh/"
    else:
        code, obj = invoke("convert", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name",
                           "HuggingFaceTB/SmolLM2-135M-Instruct", "-o", drafter).code_json
        assert code == 0, obj
        (drafter / "notes.txt").write_text("mine\n")
        target, found = drafter, "notes.txt"
    before, work_before = snapshot(target), snapshot(work)
    code, obj = invoke(*release_argv(EXAMPLE, smollm2_dir, RELEASE_REPO, work, "--dry-run", "--export-onnx"),
                       env=_hub_env(double)).code_json
    assert snapshot(target) == before and snapshot(work) == work_before, obj  # no .previous-export either
    _refused(code, obj, drafter, found)
    assert obj["failed_step"] == "convert", obj


@pytest.mark.slow
def test_release_replaces_its_own_earlier_conversion(double, smollm2_dir, tmp_path):
    work = tmp_path / "work"
    drafter = work / "drafter"
    code, obj = invoke("convert", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name",
                       "HuggingFaceTB/SmolLM2-135M-Instruct", "-o", drafter).code_json
    assert code == 0, obj
    rec = json.loads((drafter / "specconv.json").read_text())
    rec["conversion"]["notes"] = ["the earlier run"]
    (drafter / "specconv.json").write_text(json.dumps(rec))
    code, obj = invoke(*release_argv(EXAMPLE, smollm2_dir, RELEASE_REPO, work, "--dry-run", "--prompts", "humaneval",
                                     "--num-prompts", "1", "--max-new-tokens", "8", "--device", "cpu"),
                       env=_hub_env(double)).code_json
    steps = {s["step"]: s["status"] for s in obj["steps"]}
    assert steps["convert"] == "ok", obj
    assert "the earlier run" not in json.loads((drafter / "specconv.json").read_text())["conversion"]["notes"]
