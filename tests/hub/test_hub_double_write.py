"""The Hub double's write half answers like the Hub for the endpoints specconv uses
(tests/hub_double_write.py): bad repo ids, missing credentials, a stale parentCommit, an
LFS file never uploaded, tags that exist; driven with the library's own HTTP client."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from hub_double import HubDouble

TOKEN = "hf_doubleFAKE0123456789"


@pytest.fixture
def double():
    d = HubDouble(token=TOKEN).start()
    yield d
    d.stop()


def _ndjson(*lines) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def test_write_endpoints_refuse_what_the_hub_refuses(double):
    import httpx2

    auth = {"Authorization": f"Bearer {TOKEN}"}
    api = f"{double.url}/api"
    with httpx2.Client() as c:
        assert c.post(f"{api}/repos/create", json={"name": "x", "organization": "o"}).status_code == 401
        assert c.post(f"{api}/repos/create", json={"name": "bad--x", "organization": "o"},
                      headers=auth).status_code == 400
        r = c.post(f"{api}/repos/create", json={"name": "x", "organization": "o", "visibility": "private"},
                   headers=auth)
        assert r.status_code == 200 and r.json()["url"].endswith("/o/x")
        again = c.post(f"{api}/repos/create", json={"name": "x", "organization": "o"}, headers=auth)
        assert again.status_code == 409 and again.json()["url"].endswith("/o/x")  # the client reads url on 409
        assert c.get(f"{api}/models/o/x/revision/main").status_code == 404  # private: invisible without a token
        head = c.get(f"{api}/models/o/x/revision/main", headers=auth).json()["sha"]
        hdr = {**auth, "Content-Type": "application/x-ndjson"}
        add = {"key": "file",
               "value": {"path": "a.txt", "content": base64.b64encode(b"hi").decode(), "encoding": "base64"}}
        stale = _ndjson({"key": "header", "value": {"summary": "s", "parentCommit": "0" * 40}}, add)
        assert c.post(f"{api}/models/o/x/commit/main", content=stale, headers=hdr).status_code == 412
        oid = hashlib.sha256(b"weights").hexdigest()
        lfs = _ndjson({"key": "header", "value": {"summary": "s", "parentCommit": head}},
                      {"key": "lfsFile", "value": {"path": "m.safetensors", "algo": "sha256", "oid": oid, "size": 7}})
        assert c.post(f"{api}/models/o/x/commit/main", content=lfs, headers=hdr).status_code == 422
        ok = c.post(f"{api}/models/o/x/commit/main", content=_ndjson(
            {"key": "header", "value": {"summary": "s", "parentCommit": head}}, add), headers=hdr)
        assert ok.status_code == 200 and ok.json()["commitOid"] != head
        new = ok.json()["commitOid"]
        assert c.post(f"{api}/models/o/x/tag/{new}", json={"tag": "v1"}, headers=auth).status_code == 200
        assert c.post(f"{api}/models/o/x/tag/main", json={"tag": "v1"}, headers=auth).status_code == 409
        refs = c.get(f"{api}/models/o/x/refs", headers=auth).json()
        assert refs["tags"] == [{"name": "v1", "ref": "refs/tags/v1", "targetCommit": new}]
        gone = c.post(f"{api}/models/o/x/commit/main", content=_ndjson(
            {"key": "header", "value": {"summary": "s"}}, {"key": "deletedFile", "value": {"path": "nope"}}),
                      headers=hdr)
        assert gone.status_code == 404 and gone.headers["x-error-code"] == "EntryNotFound"
    assert [r for r in double.writes if r.path.endswith("/validate-yaml")] == []
    assert double.bytes_received > 0
