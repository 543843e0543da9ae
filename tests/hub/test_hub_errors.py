"""Hub download failures map to the documented exit codes (5 auth, 7 transient, 3 otherwise)."""

from __future__ import annotations

import pytest
from huggingface_hub import constants
from huggingface_hub import errors as hf

from specconv.errors import HubAuthError, InvalidInputError, TransientRemoteError
from specconv.hub import hub_error

httpx = pytest.importorskip("httpx2")  # the HTTP client huggingface_hub 2.x builds its errors on


def _resp(status: int) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/x"))


@pytest.mark.parametrize(
    "exc, offline, cls, exit_code",
    [
        (lambda: hf.GatedRepoError("gated", response=_resp(403)), False, HubAuthError, 5),
        (lambda: hf.HfHubHTTPError("unauthorised", response=_resp(401)), False, HubAuthError, 5),
        (lambda: hf.HfHubHTTPError("server", response=_resp(503)), False, TransientRemoteError, 7),
        (lambda: hf.HfHubHTTPError("rate", response=_resp(429)), False, TransientRemoteError, 7),
        (lambda: hf.LocalEntryNotFoundError("connection failed and not cached"), False, TransientRemoteError, 7),
        (lambda: hf.LocalEntryNotFoundError("not cached"), True, InvalidInputError, 3),
        (lambda: hf.EntryNotFoundError("no such file"), False, InvalidInputError, 3),
    ],
)
def test_hub_error_exit_codes(monkeypatch, exc, offline, cls, exit_code):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    err = hub_error("config.json", "owner/repo", exc(), code="verifier_not_found")
    assert type(err) is cls
    assert err.exit_code == exit_code
    assert "owner/repo" in err.message


@pytest.mark.parametrize("exc", [lambda: hf.OfflineModeIsEnabled("offline mode is enabled"),
                                 lambda: hf.LocalEntryNotFoundError("not cached")], ids=["offline mode", "not cached"])
def test_the_offline_hint_depends_on_the_operation(monkeypatch, exc):
    """Offline, a download is told to fill the cache; a push (reading the remote state, even
    for --dry-run) is not: no cache makes a push work. Exit 3 either way."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    download = hub_error("config.json", "owner/repo", exc(), code="verifier_not_found")
    push = hub_error("the repo state", "owner/repo", exc(), code="hub_error", writes=True)
    assert type(download) is type(push) is InvalidInputError and download.exit_code == push.exit_code == 3
    assert "hf download" in download.hint and "HF_HUB_OFFLINE" in download.hint
    assert "HF_HUB_OFFLINE" in push.hint and "cache" not in push.hint and "download" not in push.hint, push.hint
