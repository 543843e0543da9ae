"""What ``specconv push`` publishes: the validated files of a drafter directory plus files
derived from its ``specconv.json`` (regenerated on every push, byte-deterministic). The gates
are docs/cli.md's ("Gates (exit 4)"), one function per kind of file below.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engines import exporters
from ..engines.card import CardFiles, published_verifier
from ..errors import GateFailedError, InvalidInputError
from ..record import SPECCONV_JSON, read_record

#: files push regenerates (never taken from the directory)
DERIVED = ("README.md", SPECCONV_JSON, "acceptance.png", ".gitattributes", "specconv-manifest.json")
MANIFEST = "specconv-manifest.json"
#: LFS rules written to ``.gitattributes`` (the Hub's defaults plus engine files)
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n"
                        for p in ("*.safetensors", "*.onnx", "*.onnx.data", "*.plan", "*.gguf", "*.png"))
_WEIGHTS = ("config.json", "model.safetensors.index.json")
#: keys dropped from the published record: timings, hosts, wall-clock stamps
_VOLATILE = ("created", "speedup", "device", "host", "hostname", "report", "verifier_dir", "duration")


@dataclass
class Payload(CardFiles):
    """The files of one push (what the card lists, :class:`~specconv.engines.card.CardFiles`, and more).

    Attributes:
        sha256: path in repo → sha256 hex of its bytes.
        warnings: notes for the JSON result and the card.
    """

    sha256: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def add(self, path: str, src: Path | bytes, digest: str | None = None) -> None:
        """Add one file (its sha256 computed unless given)."""
        from ..tensors import sha256_file

        self.files[path] = src
        self.sha256[path] = digest or (hashlib.sha256(src).hexdigest() if isinstance(src, bytes) else sha256_file(src))

    def size(self, path: str) -> int:
        src = self.files[path]
        return len(src) if isinstance(src, bytes) else src.stat().st_size


def _gate_verifier_weights(label: str, contains: bool, allow_vw: bool, p: Payload, note: str = "") -> None:
    """Engine files that embed the verifier's embedding / LM head: refused without
    ``--allow-verifier-weights``, else ``p.contains_verifier_weights`` is set (the card says so).

    Raises:
        GateFailedError: ``contains_verifier_weights`` (exit 4) when ``contains`` and not ``allow_vw``.
    """
    if not contains:
        return
    if not allow_vw:
        raise GateFailedError(f"{label}: contains_verifier_weights (the verifier's embedding / LM head){note}",
                              code="contains_verifier_weights",
                              hint="pass --allow-verifier-weights if the verifier's license allows redistribution")
    p.contains_verifier_weights = True


def _owner(d: Path, rec: Any, rel: str) -> Any:
    """The export capability whose files include ``rel``, or None."""
    return next((cap for cap in exporters() if cap.owns(d, rec, rel)), None)


def _link_problem(root: Path, path: Path) -> str | None:
    """Why link ``path`` (under real dir ``root``) may not be published, or None: its real path
    lies outside ``root``, names nothing, or lies in a hidden entry push never publishes."""
    real = Path(os.path.realpath(path))
    if real != root and root not in real.parents:
        return f"a link to {real}, outside {root}"
    if not real.exists():
        return f"a link to {real}, which does not exist"
    if any(x.startswith(".") for x in real.relative_to(root).parts):
        return f"a link to {real}, a hidden entry push never publishes"
    return None


def _walk(d: Path) -> tuple[list[str], dict[str, str]]:
    """The files under ``d`` (hidden entries skipped) as relative POSIX paths, and the links refused
    (``"path"`` / ``"path/"`` → why; docs/cli.md: a link inside ``d`` is followed, a loop refused)."""
    root = Path(os.path.realpath(d))
    files: list[str] = []
    refused: dict[str, str] = {}

    def visit(here: Path, prefix: str, chain: tuple[Path, ...]) -> None:  # os.walk's order: files, then dirs
        with os.scandir(here) as it:
            entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
        dirs = []
        for e in entries:
            is_dir = e.is_dir()  # follows a link
            why = _link_problem(root, Path(e.path)) if e.is_symlink() else None
            real = Path(os.path.realpath(e.path))
            if why is None and is_dir and real in chain:
                why = f"a link to {real}, a directory it lies in (a loop)"
            if why is not None:
                refused[prefix + e.name + ("/" if is_dir else "")] = why
            elif is_dir:
                dirs.append((Path(e.path), prefix + e.name + "/", chain + (real,)))
            else:
                files.append(prefix + e.name)
        for sub in dirs:
            visit(*sub)

    visit(d, "", (root,))
    return files, refused


def _kept(rel: str, include: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    """``--include`` / ``--exclude`` keep ``rel`` (a directory is matched as ``NAME/``)."""
    if include and not any(fnmatch.fnmatch(rel, g) for g in include):
        return False
    return not any(fnmatch.fnmatch(rel, g) for g in exclude)


def _local_files(d: Path, include: tuple[str, ...], exclude: tuple[str, ...]) -> list[str]:
    """Relative POSIX paths of the files under ``d`` (hidden entries and derived files skipped),
    filtered by globs (links: :func:`_walk`; the refused ones are :func:`check_links`')."""
    return [rel for rel in _walk(d)[0] if rel not in DERIVED and _kept(rel, include, exclude)]


def check_links(d: Path, refused: dict[str, str], what: str = "DIR") -> None:
    """Refuse the links of ``refused`` (path → why: :func:`_walk`, :func:`link_problems`) before any network use.

    Raises:
        GateFailedError: ``link_outside_dir`` (exit 4), naming each link and its target.
    """
    if refused:
        raise GateFailedError(f"{d}: push publishes only the files inside {what}; refused: "
                              + "; ".join(f"{rel} ({why})" for rel, why in sorted(refused.items())),
                              code="link_outside_dir",
                              hint="replace each link by a copy of what it points to (`cp -L LINK COPY`, `cp -rL` "
                                   "for a directory, then move COPY over LINK), or leave it out with --exclude GLOB")


def link_problems(d: Path, names: list[Path]) -> dict[str, str]:
    """The files of ``names`` (in dir ``d``) that are links push refuses (name → why)."""
    root = Path(os.path.realpath(d))
    return {f.name: why for f in names if f.is_symlink() and (why := _link_problem(root, f)) is not None}


def _report_files(rec: Any) -> set[str]:
    """The validation report's files when it lies inside the drafter dir: they hold timings
    and host paths, and the card and the published record carry their numbers instead."""
    rel = rec.validation.report if rec.validation is not None else None
    if not rel or rel.startswith(".."):
        return set()
    folder = Path(rel).parent.as_posix()
    return {(f"{folder}/{n}" if folder != "." else n) for n in ("validation.json", "validation.md", "acceptance.png")}


def check_verifier_hub_id(name: str | None, where: str, hint: str) -> None:
    """Refuse to publish a drafter whose verifier ``name`` is not a Hub repo id (docs/cli.md, "Gates";
    no flag waives it); ``where`` holds it, ``hint`` says how to fix it.

    Raises:
        GateFailedError: ``verifier_not_hub_id``.
    """
    from .. import hub

    if hub.is_hub_id(name):
        return
    raise GateFailedError(f"{where}: the verifier {name!r} is a local path or no Hub repo id; published, the config "
                          "and the card's base_model would carry it and vLLM 0.33 `vllm serve ORG/NAME` needs the "
                          "verifier's Hub id there", code="verifier_not_hub_id", hint=hint)


def _check_config_verifier(d: Path) -> None:
    """:func:`check_verifier_hub_id` on ``d/config.json`` (exit 3 when it does not parse)."""
    try:
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"{d / 'config.json'}: cannot read: {e}", code="not_speculators_dir") from e
    check_verifier_hub_id(published_verifier(cfg), f"{d / 'config.json'} speculators_config.verifier.name_or_path",
                          "convert again with --verifier-name ORG/NAME (the verifier's Hub id), then validate; "
                          "editing config.json would rightly count as modified after validation")


def _not_validated(msg: str, code: str = "not_validated") -> GateFailedError:
    return GateFailedError(msg, code=code, hint="run `specconv validate DIR --verifier V` first, "
                                                "or pass --allow-unvalidated (recorded in the card)")


def _check_validated(d: Path, rec: Any, names: list[str], allow: bool, p: Payload) -> None:
    """The weights/config/index files: pushed only with a passed validation of these very bytes."""
    from ..tensors import sha256_file

    v = rec.validation
    recorded = (v.files or {}) if v is not None else {}
    passed = v is not None and bool(v.passed)
    if not passed:
        if not allow:
            raise _not_validated(f"{d}: specconv.json holds no passed validation")
        p.warnings.append("pushed without a passed validation (--allow-unvalidated)")
    for n in names:
        digest = sha256_file(d / n)
        if passed and recorded.get(n) != digest and not allow:
            raise _not_validated(f"{d / n} changed after validation (sha256 {digest[:12]}… ≠ recorded "
                                 f"{(recorded.get(n) or 'none')[:12]}…)", code="modified_after_validation")
        if not passed or recorded.get(n) != digest:
            p.unvalidated.append(n)
        p.add(n, d / n, digest)
    missing = sorted(set(recorded) - set(names))
    if missing and passed and not allow:
        raise _not_validated(f"{d}: validated file(s) missing now: {', '.join(missing)}",
                             code="modified_after_validation")


def _check_engines(rec: Any, allow: tuple[str, ...], p: Payload) -> None:
    """An engine ``validate --compare`` found departing from specconv's loop (the record's
    ``validation.engines``) is refused unless named by ``--allow-departing`` (then the card says so);
    ``inconclusive`` never refuses.

    Raises:
        GateFailedError: ``engine_departs``.
    """
    rows = (rec.validation.engines or []) if rec.validation is not None else []
    for row in rows:
        if row.verdict != "departs":
            continue
        if row.engine not in allow:
            where = f"position {row.position}" if row.position else "τ"
            raise GateFailedError(f"{row.engine} departs from specconv's loop at {where} ({row.direction}; likely "
                                  f"{row.cause}): the card would advertise acceptance that engine does not serve",
                                  code="engine_departs", hint=f"fix the {row.engine} serving, validate again with "
                                  f"--compare, or pass --allow-departing {row.engine} (the card says so)")
        p.departing.append(str(row.engine))
        p.warnings.append(f"pushed although {row.engine} departs (--allow-departing {row.engine})")


def _engine_file(d: Path, rec: Any, rel: str, allow_vw: bool, p: Payload) -> bool | None:
    """Whether ``rel`` is pushable as a file of an engine's export (its check recorded these bytes;
    :meth:`~specconv.engines.base.Exporter.push_verdict`); None: it stays local unless asked for.

    Raises:
        InvalidInputError: an export meta of another format version (exit 3, "re-export").
        GateFailedError: verifier tensors without ``--allow-verifier-weights``.
    """
    cap = _owner(d, rec, rel)
    if cap is None:
        return False
    v = cap.push_verdict(d, rec, rel)
    if v.stays_local:
        return None
    if v.covered:
        _gate_verifier_weights(v.label or rel, v.verifier_weights, allow_vw, p, v.note)
    return v.covered


def _is_core(rel: str) -> bool:
    """The drafter's own files: config, index, top-level safetensors."""
    return rel in _WEIGHTS or ("/" not in rel and rel.endswith(".safetensors"))


def _check_filters_keep_drafter(d: Path, core: list[str], include: tuple[str, ...], exclude: tuple[str, ...]) -> None:
    """``--include`` / ``--exclude`` may leave out extra files, never the drafter itself
    (config, weights, index): that would publish a card without a loadable model (exit 2)."""
    if not (include or exclude):
        return
    dropped = sorted(set(filter(_is_core, _local_files(d, (), ()))) - set(core))
    if dropped:
        from ..errors import UsageError

        raise UsageError(f"--include/--exclude leave out the drafter's own file(s) {', '.join(dropped)}; "
                         "a drafter is pushed whole", code="filter_drops_drafter")


def collect(d: Path, *, include: tuple[str, ...] = (), exclude: tuple[str, ...] = (), allow_unvalidated: bool = False,
            allow_verifier_weights: bool = False, allow_departing: tuple[str, ...] = ()) -> tuple[Payload, Any]:
    """``(payload, record)``: the pushable files of drafter dir ``d`` (derived files not yet added).

    Raises:
        GateFailedError: a verifier not named by a Hub id, not validated, modified after
            validation, an ungated file without ``--allow-unvalidated``, or verifier weights
            without the flag (exit 4).
        InvalidInputError: ``d`` is no drafter directory (exit 3).
    """
    if not (d / "config.json").is_file() and not (d / "config.json").is_symlink():
        raise InvalidInputError(f"{d} is not a drafter directory (no config.json)", code="not_speculators_dir")
    rec = read_record(d, missing_ok=True)
    apart = [cap for cap in exporters() if cap.separate_repo]

    def pushed(rel: str) -> bool:  # a file of DIR push would publish (or read, as the record)
        return rel == SPECCONV_JSON or (rel not in DERIVED and _kept(rel, include, exclude)
                                        and rel not in _report_files(rec)
                                        and not any(c.owns(d, rec, rel) for c in apart))

    files, refused = _walk(d)
    check_links(d, {rel: why for rel, why in refused.items() if pushed(rel)})
    _check_config_verifier(d)
    if rec.conversion is None and not allow_unvalidated:
        raise _not_validated(f"{d}: no specconv.json record (convert it with specconv first)")
    rels = [r for r in files if pushed(r) and r != SPECCONV_JSON]
    core = [r for r in rels if _is_core(r)]
    _check_filters_keep_drafter(d, core, include, exclude)
    p = Payload()
    _check_validated(d, rec, core, allow_unvalidated, p)
    _check_engines(rec, allow_departing, p)
    for rel in rels:
        if rel in core:
            continue
        ok = _engine_file(d, rec, rel, allow_verifier_weights, p)
        if ok is None:  # stays local unless asked for (the ONNX fp32 twin)
            continue
        if not ok:
            if not allow_unvalidated:
                raise GateFailedError(f"{rel}: not covered by a validation or export check", code="ungated_file",
                                      hint="leave it out with --exclude GLOB, or pass --allow-unvalidated "
                                           "(listed in the card)")
            p.unvalidated.append(rel)
        p.add(rel, d / rel)
    return p, rec


def _scrub(obj: Any) -> Any:
    """Drop timings, host names and absolute paths, recursively (deterministic projection)."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in _VOLATILE or k.endswith(("_ms", "_s", "_seconds")):
                continue
            if isinstance(v, str) and (os.path.isabs(v) or v.startswith("..")):
                continue
            out[k] = _scrub(v)
        return out
    if isinstance(obj, list):
        return [_scrub(x) for x in obj if not (isinstance(x, str) and os.path.isabs(x))]
    return obj


def project_record(rec: Any) -> dict[str, Any]:
    """The record as published: relative paths only, no timings or hosts, no ``publish``
    section (a re-run from another directory or machine yields the same bytes)."""
    from ..results import plain

    data = plain(rec)
    data.pop("publish", None)
    conv = data.get("conversion") or {}
    src = conv.get("source") or {}
    if not src.get("hub_id"):
        src.pop("path", None)  # a local path means nothing on the Hub
    return _scrub(data)


def derived_files(p: Payload, rec: Any, card: str, plot: bytes | None) -> None:
    """Add the regenerated files: record projection, card, plot, ``.gitattributes``, manifest."""
    p.add(SPECCONV_JSON, (json.dumps(project_record(rec), sort_keys=True, indent=2) + "\n").encode())
    p.add("README.md", card.encode("utf-8"))
    if plot is not None:
        p.add("acceptance.png", plot)
    add_manifest(p)


def add_manifest(p: Payload) -> None:
    """Add ``.gitattributes`` and the manifest of every file specconv publishes (the last files added)."""
    p.add(".gitattributes", GITATTRIBUTES.encode())
    owned = {k: v for k, v in sorted(p.sha256.items()) if k != ".gitattributes"}
    manifest = {"schema": "specconv.manifest/v1", "files": {**owned, MANIFEST: None}}
    p.add(MANIFEST, (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode())
