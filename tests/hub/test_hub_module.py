"""``specconv/hub.py`` is the only Hub module: the import scan, the one ``HfApi`` factory,
the one repo-id predicate and the ordered error table (exit codes 3 / 5 / 7 / 9)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specconv import hub
from specconv.errors import HubAuthError, HubConflictError, InvalidInputError, RemoteNotFoundError, TransientRemoteError

ROOT = Path(__file__).resolve().parents[2]


def _imports_huggingface_hub(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(a.name.split(".")[0] == "huggingface_hub" for a in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "huggingface_hub":
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__"):
            if any(isinstance(a, ast.Constant) and str(a.value).startswith("huggingface_hub") for a in node.args):
                lines.append(node.lineno)
    return lines


@pytest.mark.slow
def test_only_the_hub_module_imports_huggingface_hub():
    files = sorted((ROOT / "specconv").rglob("*.py"))
    assert len(files) > 20
    # engines/vllm/runner.py runs inside the separate vLLM interpreter and imports nothing from specconv
    exempt = {ROOT / "specconv" / "hub.py", ROOT / "specconv" / "engines" / "vllm" / "runner.py"}
    offenders = {str(f.relative_to(ROOT)): ln for f in files if f not in exempt and (ln := _imports_huggingface_hub(f))}
    assert offenders == {}
    assert _imports_huggingface_hub(ROOT / "specconv" / "hub.py")  # the scan does see imports


def test_importing_the_hub_module_does_not_import_huggingface_hub():
    import subprocess
    import sys

    code = "import sys, specconv.hub, specconv.verifier; print('huggingface_hub' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", [
    "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "z-lab/Qwen3-8B-DFlash-b16", "a/b/c", "foo--bar", "foo.git",
    "-lead", "trail-", "org/trail.", "x" * 97, "has space", "a/", "/abs", "./rel", "org/na..me", "ok_name.v2",
])
def test_repo_id_predicate_agrees_with_huggingface_hub(name, tmp_path, monkeypatch):
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    monkeypatch.chdir(tmp_path)  # no local path of these names exists here
    try:
        validate_repo_id(name)
        valid = True
    except HFValidationError:
        valid = False
    assert hub.is_hub_id(name) is valid


def test_repo_id_predicate_refuses_existing_paths_and_is_the_one_predicate(tmp_path, monkeypatch):
    from specconv import format as speculators_format
    from specconv import verifier

    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "model").mkdir()
    assert not hub.is_hub_id("org/model") and hub.is_hub_id("org/other")
    assert speculators_format.is_hub_repo_id is hub.is_hub_id
    assert verifier.is_hub_id is hub.is_hub_id


def test_api_reads_endpoint_and_token_at_call_time(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1/")
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token_for_test")
    a = hub.api()
    assert (a.endpoint, a.token) == ("http://127.0.0.1:1", "hf_fake_token_for_test")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:2")
    assert hub.api().endpoint == "http://127.0.0.1:2"
    b = hub.api("http://explicit.example", "tok2")
    assert (b.endpoint, b.token) == ("http://explicit.example", "tok2")
    monkeypatch.delenv("HF_ENDPOINT")
    monkeypatch.delenv("HF_TOKEN")
    assert hub.endpoint() is None and hub.token() is None


def _resp(status: int):
    import httpx2

    return httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/api/models/o/r"))


@pytest.mark.parametrize("writes", [False, True], ids=["download", "upload"])
def test_error_table_is_ordered_subclass_first(writes):
    """The rows a call sees (upload-side calls: the ``writes`` rows first) never put a base
    class, unconditionally, before one of its subclasses."""
    from huggingface_hub import errors as hf

    rows = [r for r in hub.HUB_ERROR_RULES if writes or not r.writes]
    assert rows == sorted(rows, key=lambda r: not r.writes)  # the writes rows are a prefix
    builtin = {"ConnectionError": ConnectionError, "TimeoutError": TimeoutError, "ValueError": ValueError}
    cls = [getattr(hf, r.exc, None) or builtin.get(r.exc) for r in rows]
    for i, r in enumerate(rows):
        if r.exc == "TransportError":
            continue
        assert cls[i] is not None, r.exc
        for j in range(i):
            if cls[j] is None or rows[j].when is not None:
                continue
            if issubclass(cls[i], cls[j]):  # shadowed on purpose only by the upload-side ValueError row
                # or by the upload side's own row for the same exception (offline: its hint)
                assert rows[j].writes and rows[j].exc in ("ValueError", r.exc), f"{r.exc} is shadowed by {rows[j].exc}"


@pytest.mark.parametrize("make, writes, cls, exit_code, code, words", [
    (lambda: __import__("huggingface_hub").errors.HfHubHTTPError("moved", response=_resp(412)), True,
     HubConflictError, 6, "parent_commit_moved", "branch head moved"),
    (lambda: __import__("huggingface_hub").errors.HfHubHTTPError("exists", response=_resp(409)), True,
     HubConflictError, 6, "hub_conflict", "409"),
    # huggingface_hub reports a 401 on a repo URL as "not found": for a write it is the credentials
    (lambda: __import__("huggingface_hub").errors.RepositoryNotFoundError("nope", response=_resp(401)), True,
     HubAuthError, 5, "hub_auth", "refused the credentials (HTTP 401)"),
    (lambda: __import__("huggingface_hub").errors.RepositoryNotFoundError("nope", response=_resp(401)), False,
     RemoteNotFoundError, 9, "hub_repo_not_found", "cannot fetch"),
    (lambda: __import__("huggingface_hub").errors.BadRequestError("bad", response=_resp(400)), True,
     InvalidInputError, 3, "hub_rejected", "committing on 'o/r': bad"),
    (lambda: ValueError("invalid metadata"), True, InvalidInputError, 3, "hub_rejected", "invalid metadata"),
    (lambda: ValueError("invalid metadata"), False, InvalidInputError, 3, "x_code", "cannot fetch"),
    (lambda: __import__("huggingface_hub").errors.HfHubHTTPError("server", response=_resp(503)), True,
     TransientRemoteError, 7, "hub_unreachable", "cannot fetch"),
])
def test_error_table_upload_rows(make, writes, cls, exit_code, code, words):
    """The upload-side rows (once ``publish_error``) live in the same table, before the shared ones."""
    err = hub.hub_error("committing", "o/r", make(), code="x_code", writes=writes)
    assert type(err) is cls and err.exit_code == exit_code and err.code == code
    assert words in err.message


def test_hub_functions_raise_mapped_errors(tmp_path, monkeypatch):
    """A download names what the caller wanted (role prefix, slug, hint); an absent optional
    file is None; an upload-side call maps the 412 of its one ``create_commit``."""
    from huggingface_hub import constants
    from huggingface_hub import errors as hf

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    wanted = hub.Wanted("config.json", code="verifier_not_found", hint="pass a local dir", role="verifier")
    with pytest.raises(InvalidInputError) as e:
        hub.download_file("o/r", "config.json", wanted=wanted)
    assert e.value.code == "verifier_not_found" and e.value.message.startswith("verifier: config.json of 'o/r'")
    assert e.value.hint == "pass a local dir" and isinstance(e.value.__cause__, hf.LocalEntryNotFoundError)
    assert hub.download_file("o/r", "model.safetensors.index.json", missing_ok=True) is None

    class Refusing:
        def create_commit(self, *a, **kw):
            raise hf.HfHubHTTPError("moved", response=_resp(412))

    with pytest.raises(HubConflictError) as e:
        hub.commit(Refusing(), "o/r", {"a": b"x"}, [], message="m", description="d", revision="main",
                   parent_commit="0" * 40)
    assert e.value.code == "parent_commit_moved" and e.value.message.startswith("committing on 'o/r'")


def _hub_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to the ``specconv.hub`` module, names imported from it) in one module."""
    modules, members = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[-1] == "hub" and (
                n.level or (n.module or "").startswith("specconv")):
            members |= {a.asname or a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and (n.level or n.module == "specconv"):
            modules |= {a.asname or a.name for a in n.names if a.name == "hub"}
    return modules, members


def _calls_hub(node: ast.AST, modules: set[str], members: set[str]) -> bool:
    for c in ast.walk(node):
        if isinstance(c, ast.Call):
            f = c.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules:
                return True
            if isinstance(f, ast.Name) and f.id in members:
                return True
    return False


def _broad(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return handler.type is None or any(isinstance(t, ast.Name) and t.id in ("Exception", "BaseException")
                                       for t in types)


def hub_calls_under_broad_except(path: Path) -> list[int]:
    """Lines of ``try`` blocks in ``path`` that catch a bare ``Exception`` / ``BaseException`` /
    everything and either call into ``specconv.hub`` or sit in a module that imports it (a
    Hub function handed to a wrapper, ``_call(what, repo, hub.refs, ...)``, is a call too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    modules, members = _hub_names(tree)
    return [t.lineno for t in ast.walk(tree) if isinstance(t, ast.Try) and any(_broad(h) for h in t.handlers)
            and (modules or members or any(_calls_hub(stmt, modules, members) for stmt in t.body))]


@pytest.mark.slow
def test_hub_errors_are_mapped_only_at_the_hub_boundary():
    """Nothing outside ``specconv/hub.py`` catches a bare ``Exception`` around a Hub call, and
    no module that imports the Hub module catches one at all: ``hub.py`` raises specconv
    errors from its one table (issue 15 item 5)."""
    files = sorted((ROOT / "specconv").rglob("*.py"))
    offenders = {str(f.relative_to(ROOT)): ln for f in files if f.name != "hub.py" or f.parent.name != "specconv"
                 if (ln := hub_calls_under_broad_except(f))}
    assert offenders == {}


def test_the_boundary_scan_sees_a_wrapped_hub_call(tmp_path):
    """The scan flags the shape the call sites had before (a try around ``hub.x`` / an
    imported Hub function, caught as ``Exception``) and passes a narrow catch."""
    bad = tmp_path / "bad.py"
    bad.write_text("from . import hub as _hub\nfrom .hub import download_file\n"
                   "def f():\n    try:\n        _hub.download_file('o/r', 'x')\n    except Exception:\n        raise\n"
                   "def g():\n    try:\n        download_file('o/r', 'x')\n    except:\n        raise\n"
                   "def h():\n    try:\n        _hub.download_file('o/r', 'x')\n    except OSError:\n        raise\n")
    assert hub_calls_under_broad_except(bad) == [4, 9]
    wrapper = tmp_path / "wrapper.py"  # push's former _call: the Hub function is an argument
    wrapper.write_text("def _call(fn, *a):\n    try:\n        return fn(*a)\n    except Exception:\n        raise\n"
                       "def push(hf):\n    from .. import hub\n    return _call(hub.refs, hf)\n")
    assert hub_calls_under_broad_except(wrapper) == [2]
    elsewhere = tmp_path / "elsewhere.py"  # no Hub import: a broad catch there is another room's business
    elsewhere.write_text("def f(g):\n    try:\n        g()\n    except Exception:\n        pass\n")
    assert hub_calls_under_broad_except(elsewhere) == []


@pytest.mark.parametrize("make, cls, exit_code, code", [
    (lambda: __import__("huggingface_hub").errors.RepositoryNotFoundError("nope", response=_resp(404)),
     RemoteNotFoundError, 9, "hub_repo_not_found"),
    (lambda: __import__("huggingface_hub").errors.RevisionNotFoundError("nope", response=_resp(404)),
     RemoteNotFoundError, 9, "hub_revision_not_found"),
    (lambda: __import__("huggingface_hub").errors.GatedRepoError("gated", response=_resp(401)),
     HubAuthError, 5, "hub_gated"),
    (lambda: __import__("huggingface_hub").errors.OfflineModeIsEnabled("offline"), InvalidInputError, 3, "x_code"),
    (lambda: __import__("httpx2").ConnectError("refused"), TransientRemoteError, 7, "hub_unreachable"),
    (lambda: __import__("huggingface_hub").errors.HfHubHTTPError("bad", response=_resp(400)),
     InvalidInputError, 3, "x_code"),
])
def test_error_table_rows(make, cls, exit_code, code):
    err = hub.hub_error("config.json", "o/r", make(), code="x_code")
    assert type(err) is cls and err.exit_code == exit_code and err.code == code
    assert "o/r" in err.message and "config.json" in err.message
    if cls is not InvalidInputError:
        assert err.hint


def test_hub_module_never_imports_torch():
    tree = ast.parse((ROOT / "specconv" / "hub.py").read_text(encoding="utf-8"))
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0]
             for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    assert "torch" not in mods and "huggingface_hub" in mods


def test_bytes_counter_counts_what_the_client_reads(tmp_path, monkeypatch):
    """The response hook counts body bytes on huggingface_hub's own session (loopback double;
    offline mode, which blocks loopback too, is lifted on the library's constants for this test)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    from hub_double import HubDouble

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    d = HubDouble().start()
    try:
        d.add_repo("o/r", {"config.json": b"{}" * 500})
        hub.api()  # installs the counting client factory
        before = hub.bytes_downloaded()
        r = get_session().get(f"{d.url}/o/r/resolve/main/config.json")
        assert r.status_code == 200 and len(r.content) == 1000
        assert hub.bytes_downloaded() - before == 1000 == d.bytes_sent
    finally:
        d.stop()
