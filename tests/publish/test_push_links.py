"""``push`` publishes only what lies inside DIR (issue 24 item 3): links are judged by their
real path, before any network use, with or without ``--allow-unvalidated``.

The rules (docs/cli.md, "push"): a file link whose real path lies outside DIR, in a hidden
entry (push never publishes one) or nowhere is refused (``link_outside_dir``, exit 4) with the
``cp -L`` hint; so is a directory link out of DIR (as ``NAME/``, without walking it) and one
that loops; a link that stays inside DIR is published under its own name (a file link with its
target's bytes, a directory link walked). ``--exclude`` leaves a link out like any file. The
end-to-end refusals (a validated weight file, the CLI, the Hub double seeing no request) are in
``test_publish.py``; here the payload rules on a small unvalidated dir, fast.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from specconv.errors import GateFailedError
from specconv.publish.payload import collect


def _dir(root: Path) -> Path:
    """A drafter dir as push reads it (no record: pushed with ``allow_unvalidated``)."""
    d = root / "drafter"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"speculators_config": {"verifier": {"name_or_path": "org/verifier"}}}))
    (d / "model.safetensors").write_bytes(b"weights")
    (d / "sub" / "notes.txt").write_text("inside\n")
    return d


def _refused(d: Path, **kw) -> GateFailedError:
    with pytest.raises(GateFailedError) as e:
        collect(d, allow_unvalidated=True, **kw)
    assert e.value.code == "link_outside_dir" and e.value.exit_code == 4
    assert "`cp -L" in e.value.hint and "--exclude" in e.value.hint
    return e.value


def test_a_file_link_out_of_dir_is_refused_and_an_excluded_one_left_out(tmp_path):
    d = _dir(tmp_path)
    secret = tmp_path / "token"
    secret.write_text("hf_not_for_the_hub\n")
    (d / "token.txt").symlink_to(secret)
    e = _refused(d)
    assert f"token.txt (a link to {secret}, outside {d.resolve()})" in e.message
    p, _ = collect(d, allow_unvalidated=True, exclude=("token.txt",))
    assert "token.txt" not in p.files and b"hf_not_for_the_hub" not in b"".join(
        x if isinstance(x, bytes) else x.read_bytes() for x in p.files.values())


def test_links_inside_dir_are_published_under_their_own_names(tmp_path):
    d = _dir(tmp_path)
    (d / "alias.txt").symlink_to("sub/notes.txt")  # relative, inside
    (d / "mirror").symlink_to(d / "sub")  # absolute, inside: walked
    p, _ = collect(d, allow_unvalidated=True)
    assert {"alias.txt", "mirror/notes.txt", "sub/notes.txt"} <= set(p.files)
    assert p.sha256["alias.txt"] == p.sha256["mirror/notes.txt"] == hashlib.sha256(b"inside\n").hexdigest()


def test_a_dir_reached_through_a_link_is_judged_by_its_real_path(tmp_path):
    """DIR itself given as a link: its real path is the boundary, inside links still pass."""
    d = _dir(tmp_path)
    (d / "alias.txt").symlink_to("sub/notes.txt")
    link = tmp_path / "link-to-drafter"
    link.symlink_to(d)
    assert "alias.txt" in collect(link, allow_unvalidated=True)[0].files


@pytest.mark.parametrize("case", ["outside_dir", "hidden_target", "dangling", "loop"])
def test_refused_links_name_the_link_and_why(tmp_path, case):
    d = _dir(tmp_path)
    if case == "outside_dir":
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "big.bin").write_bytes(b"x")
        (d / "extra").symlink_to(tmp_path / "elsewhere")
        rel, why, glob = "extra/", f"outside {d.resolve()}", "extra/*"
    elif case == "hidden_target":
        (d / ".cache").mkdir()
        (d / ".cache" / "token").write_text("secret")
        (d / "token.txt").symlink_to(".cache/token")
        rel, why, glob = "token.txt", "a hidden entry push never publishes", "token.txt"
    elif case == "dangling":
        (d / "gone.bin").symlink_to("deleted.bin")
        rel, why, glob = "gone.bin", "which does not exist", "gone.*"
    else:
        (d / "sub" / "up").symlink_to("..")
        rel, why, glob = "sub/up/", "a directory it lies in (a loop)", "sub/up/*"
    e = _refused(d)
    assert f"{rel} (a link to " in e.message and why in e.message, e.message
    p, _ = collect(d, allow_unvalidated=True, exclude=(glob,))  # left out like any file
    assert not [f for f in p.files if f.startswith(rel.rstrip("/"))]


def test_the_sglang_repo_refuses_a_link_out_of_its_export(tmp_path):
    """``--sglang-repo-id`` publishes the export dir's files: a link out of it is refused too,
    even when its bytes are the ones the passed check recorded."""
    from specconv.engines import engine
    from specconv.engines.sglang.export import layout_files
    from specconv.publish.separate_repo import separate_payload
    from specconv.record import file_hashes, read_record, update_section_key

    d = _dir(tmp_path)
    out = d / "sglang"
    out.mkdir()
    (out / "config.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere.safetensors"
    elsewhere.write_bytes(b"sglang weights")
    os.symlink(elsewhere, out / "model.safetensors")
    files = layout_files(out)
    update_section_key(d, "export", "sglang", {"output": "sglang", "files": files, "drafter_files": file_hashes(d),
                                               "check": {"ok": True, "files": files}, "algorithm": "dflash"})
    with pytest.raises(GateFailedError) as e:
        separate_payload(engine("sglang").export, d, read_record(d), "org/drafter-sglang", "org/drafter")
    assert e.value.code == "link_outside_dir" and "model.safetensors (a link to " in e.value.message
    assert "the SGLang export" in e.value.message
