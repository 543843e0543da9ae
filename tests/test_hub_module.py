"""``specconv/hub.py`` is the only Hub module: the import scan, the one ``HfApi`` factory,
the one repo-id predicate and the ordered error table (exit codes 3 / 5 / 7 / 9)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specconv import hub
from specconv.errors import HubAuthError, InvalidInputError, RemoteNotFoundError, TransientRemoteError

ROOT = Path(__file__).resolve().parents[1]


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


def test_only_the_hub_module_imports_huggingface_hub():
    files = sorted((ROOT / "specconv").rglob("*.py"))
    assert len(files) > 20
    # vllm_check/runner.py runs inside the separate vLLM interpreter and imports nothing from specconv
    exempt = {ROOT / "specconv" / "hub.py", ROOT / "specconv" / "vllm_check" / "runner.py"}
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
    from specconv import speculators, verifier

    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "model").mkdir()
    assert not hub.is_hub_id("org/model") and hub.is_hub_id("org/other")
    assert speculators.is_hub_repo_id is hub.is_hub_id
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


def test_error_table_is_ordered_subclass_first():
    from huggingface_hub import errors as hf

    cls = [getattr(hf, r.exc, None) or {"ConnectionError": ConnectionError, "TimeoutError": TimeoutError}.get(r.exc)
           for r in hub.HUB_ERROR_RULES]
    for i, r in enumerate(hub.HUB_ERROR_RULES):
        if r.exc == "TransportError":
            continue
        assert cls[i] is not None, r.exc
        for j in range(i):
            if cls[j] is None or hub.HUB_ERROR_RULES[j].when is not None:
                continue
            assert not issubclass(cls[i], cls[j]), f"{r.exc} is shadowed by {hub.HUB_ERROR_RULES[j].exc}"


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
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
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
