"""The model card (``README.md``) of a published drafter, rendered from
``specconv/templates/model_card.md.j2`` with Jinja2 and checked with huggingface_hub's card tools
(through :func:`specconv.hub.check_card`).

Everything in it comes from the drafter's ``config.json`` and ``specconv.json`` (the
validation numbers, parity and losslessness from its typed ``validation`` section), so the
bytes are deterministic: no dates, no host paths, sorted keys. The stages write the
drafter dir's own copy: ``convert`` inside its temp dir (:func:`conversion_card`),
``validate`` and ``export onnx`` after recording (:func:`refresh_local_card`).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SpecconvError
from .payload import Payload, contains_verifier_weights, exporters, published_verifier

if TYPE_CHECKING:
    from ..results import GgufExport

log = logging.getLogger("specconv.publish")

_PERMISSIVE = ("apache-2.0", "mit", "bsd-3-clause", "bsd-2-clause")


def _front_matter_license(path: Path) -> str | None:
    readme = path / "README.md"
    if not readme.is_file():
        return None
    m = re.search(r"^---\n(.*?)\n---", readme.read_text(encoding="utf-8", errors="replace"), re.S)
    lic = m and re.search(r"^license:\s*(\S+)", m.group(1), re.M)
    return lic.group(1).strip("'\"") if lic else None


def choose_license(d: Path, rec: Any) -> tuple[str, str]:
    """The card's license: never looser than the source's and the verifier's.

    Read from the YAML of the source's and the verifier's ``README.md`` when the record's
    relative paths reach them. Equal → that license; different, or a non-permissive one
    among several → ``other``; none known → ``other``.

    Returns:
        ``(license id, note for the card)``.
    """
    conv = rec.conversion
    found: dict[str, str] = {}
    for what, rel in (("source", conv and conv.source and conv.source.path),
                      ("verifier", conv and conv.verifier and conv.verifier.spec)):
        if rel and not Path(rel).is_absolute() and (d / rel).is_dir():
            lic = _front_matter_license(d / rel)
            if lic:
                found[what] = lic
    if not found:
        return "other", "neither the source's nor the verifier's license could be read: check both before use"
    licenses = set(found.values())
    note = ", ".join(f"{k}: {v}" for k, v in sorted(found.items()))
    if len(licenses) == 1 and len(found) == 2:
        return licenses.pop(), note
    if len(found) == 1 and licenses <= set(_PERMISSIVE):
        return "other", note + "; the other license is unknown"
    return "other", note + "; the stricter terms apply"


def _fmt(x: Any, nd: int = 3) -> str:
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) else str(x)


def validation_context(rec: Any) -> dict[str, Any] | None:
    """The card's validation table values, from the record's typed ``validation`` section
    (:class:`specconv.record.ValidationSection`; None when nothing was validated)."""
    v = rec.validation
    if v is None or v.passed is None:
        return None
    ci, prompts, parity, lossless = v.tau_ci95, v.prompts, v.parity_kl_max, v.lossless_exact_match
    return {"tau": _fmt(v.acceptance_length), "ci": f"[{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else None,
            "source_tau": _fmt(v.source_acceptance_length) if v.source_acceptance_length else None,
            "per_position": ", ".join(_fmt(x) for x in v.acceptance_at_pos or []) or "n/a",
            "positions": positions_label(len(v.acceptance_at_pos)) if v.acceptance_at_pos else "per position",
            "gates": sorted((v.gates or {}).items()), "parity": f"{parity:.2e}" if isinstance(parity, float) else parity,
            "lossless": _fmt(lossless) if lossless is not None else None,
            "backend": v.backend or "torch", "dtype": v.dtype,
            "temperature": v.temperature, "prompts_n": prompts.n if prompts else None,
            "prompts_set": prompts.set if prompts else None, "max_new_tokens": v.max_new_tokens,
            "chat_template": chat_template_text(v.chat_template),
            "findings": [(f.get("code"), f.get("message")) for f in v.findings or []],
            "passed": bool(v.passed)}


def chat_template_text(t: Any) -> str | None:
    """How the prompts were rendered (the record's ``validation.chat_template``), one line:
    the template (its source and sha256), its kwargs and the thinking mode (None: not recorded)."""
    if t is None or t.source is None:
        return None
    if t.source == "none":
        return "no chat template (plain prompts, special tokens as the tokenizer adds them)"
    where = "the verifier's chat template" if t.source == "verifier" else f"chat template `{Path(t.path or '').name}`"
    thinking = {"on": "thinking on", "off": "thinking off"}.get(t.thinking or "", "no thinking switch")
    kwargs = json.dumps(t.kwargs or {}, sort_keys=True)
    return (f"{where} (sha256 `{t.sha256}`), kwargs `{kwargs}`, {thinking} (`--thinking {t.thinking_option}`), "
            "add_generation_prompt")


def runners_needed(algo: str) -> str | None:
    """The vLLM model runners that draft ``algo`` as trained, from its description
    (``VllmFacts.runners``), with the environment that picks one; None for an unknown algorithm."""
    from ..format.algorithms import find_algorithm

    a = find_algorithm(algo)
    if a is None:
        return None
    if len(a.vllm.runners) > 1:
        return " or ".join(r.upper() for r in a.vllm.runners)
    (r,) = a.vllm.runners
    return f"{r.upper()} only (`VLLM_USE_V2_MODEL_RUNNER={int(r == 'v2')}`)"


def vllm_checked(rec: Any) -> str:
    """The card's vLLM row: what vLLM did with these files, from the record's
    ``validation.vllm_load`` / ``vllm_serve`` (``specconv.validate.report.vllm_summaries``), else
    ``not checked by vLLM``."""
    v = rec.validation
    done = []
    load = v and v.vllm_load
    if load and load.version:
        done.append(f"loaded by `{load.distribution}` {load.version} (`specconv validate --vllm-load-check`)")
    serve = v and v.vllm_serve
    if serve and serve.version:
        done.append(f"served by `{serve.distribution}` {serve.version}{_serve_setup(serve)}, τ {_fmt(serve.tau)} "
                    "(`specconv validate --backend vllm`)")
    remote = v and v.remote and v.remote.vllm_serve
    if remote:  # a --server-url run: reported, never a gate (specconv.engines.vllm.remote.REMOTE_LABEL)
        done.append(f"measured on a running vLLM {remote.version or '(version unknown)'}{_serve_setup(remote)}, "
                    f"τ {_fmt(remote.tau)} (`specconv validate --server-url`: {v.remote.identity})")
    return "; ".join(done) or "not checked by vLLM"


def _serve_setup(s: Any) -> str:
    """What ran (``VllmServeSummary``, issue 16 item 6) as the card's parenthesis; an unknown
    size (a remote fingerprint that does not say) is printed as ``?``."""
    if s.mode is None:  # recorded before these fields existed
        return ""
    size = lambda n: "?" if n is None else str(n)  # noqa: E731
    parts = [s.mode, f"TP {size(s.tensor_parallel_size)} / PP {size(s.pipeline_parallel_size)} / "
                     f"DP {size(s.data_parallel_size)}", f"executor {s.executor_backend or 'vLLM default'}",
             f"concurrency {s.concurrency}"]
    if s.runner is not None:
        parts.append(f"model runner {s.runner}")
        parts.append(f"draft / rejection sampling {s.draft_sample_method or 'unreported'} / "
                     f"{s.rejection_sample_method or 'unreported'}")
    if s.engine_args:
        parts.append("engine args `" + " ".join(s.engine_args) + "`")
    extra = {k: v for k, v in (s.other_traffic or {}).items() if v}
    parts.append("other traffic " + (", ".join(f"{k} +{v:g}" for k, v in extra.items()) if extra else "none seen"))
    return " (" + "; ".join(parts) + ")"


def launch_commands(verifier: str, repo_id: str, algo: str, k: Any) -> tuple[str | None, str | None]:
    """The card's ``vllm serve`` lines, shell-quoted (:mod:`specconv.engines.vllm.serve_line`):
    ``(short form, long form)``. The short form only for a Hub verifier (vLLM 0.33 refuses a
    local one there); no long form for an algorithm vLLM has no method for."""
    from .. import hub
    from ..format.algorithms import find_algorithm
    from ..engines.vllm.serve_line import long_form_argv, shell_command, short_form_argv

    short = shell_command(short_form_argv(repo_id)) if hub.is_hub_id(verifier) else None
    if find_algorithm(algo) is None or not isinstance(k, int):
        return short, None
    return short, shell_command(long_form_argv(verifier, repo_id, algo, k))


def _metadata(rec: Any, repo_id: str, license_id: str, verifier: str) -> str:
    from .. import hub

    conv = rec.conversion
    algo = (conv.algorithm if conv else None) or "speculator"
    meta: dict[str, Any] = {"license": license_id, "library_name": "speculators",
                            "tags": sorted({algo, "speculative-decoding", "vllm", "speculators", "specconv"})}
    if hub.is_hub_id(verifier):  # the Hub reads base_model as a repo id, never a path
        meta["base_model"] = verifier
    if conv and conv.source and conv.source.hub_id:
        meta["source_model"] = conv.source.hub_id
    import yaml

    return yaml.safe_dump(meta, sort_keys=True, allow_unicode=True)


def render_card(d: Path, rec: Any, payload: Payload, repo_id: str, *, plot: bool, check: bool = True,
                sglang_draft: str | None = None, local: bool = False) -> str:
    """The README.md text for drafter dir ``d`` published as ``repo_id``; ``sglang_draft``
    names where its SGLang layout is served from (a repo id, or the local export dir): the
    card then has an SGLang section when that layout's check passed (:mod:`.sglang_repo`), a llama.cpp
    one when ``gguf/``'s did (:func:`gguf_section`). ``local``: the dir's own card (not validated: says how to).

    Raises:
        InvalidInputError: the rendered metadata does not parse (``hub.check_card``).
    """
    import jinja2

    from .. import __version__, hub
    from ..format.algorithms import find_algorithm

    cfg = json.loads((d / "config.json").read_text())
    sc = cfg.get("speculators_config") or {}
    methods = sc.get("proposal_methods") or [{}]
    conv = rec.conversion
    verifier = published_verifier(cfg) or "unknown"
    algo = sc.get("algorithm") or (conv.algorithm if conv else "unknown")
    license_id, license_note = choose_license(d, rec)
    nested = [f for f in payload.files if "/" in f]  # an engine's files live in a directory of their own
    engines = sorted(row for cap in exporters() for row in cap.card_rows(nested)) if nested else []
    val = validation_context(rec)
    k = methods[0].get("speculative_tokens")
    short_form, long_form = launch_commands(verifier, repo_id, algo, k)
    ctx = dict(metadata_yaml=_metadata(rec, repo_id, license_id, verifier), title=repo_id.split("/")[-1],
               algorithm=algo, algorithm_name=getattr(find_algorithm(algo), "display_name", algo), verifier=verifier,
               verifier_url=f"https://huggingface.co/{verifier}" if hub.is_hub_id(verifier) else None, k=k,
               **drafter_shape(cfg, algo),
               layout=[(key, json.dumps(cfg[key])) for key in ("sample_from_anchor", "norm_before_residual",
                                                             "sliding_window_non_causal", "mask_token_id") if key in cfg],
               vllm_checked=vllm_checked(rec), runners=runners_needed(algo), short_form=short_form, long_form=long_form,
               validation=val, validation_status="Passed" if val and val["passed"] else "FAILED",
               plot=plot, local=local, unvalidated=sorted(payload.unvalidated), engines=engines,
               contains_verifier_weights=payload.contains_verifier_weights,
               source_format=(conv.format if conv else None) or "unknown",
               source_repo=conv.source.hub_id if conv and conv.source else None,
               source_revision=conv.source.revision if conv and conv.source else None,
               source_files=sorted((conv.source.files or {}).items()) if conv and conv.source else [],
               specconv_version=rec.specconv_version or __version__, license=license_id, license_note=license_note,
               sglang=_sglang_section(d, rec, verifier, sglang_draft),
               gguf=gguf_section(d, rec, payload, None if local else repo_id))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_templates())), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    text = env.get_template("model_card.md.j2").render(**ctx)
    if check:  # huggingface_hub's card tools (push always checks; a local refresh skips the import)
        hub.check_card(text)
    return text


def drafter_shape(cfg: dict[str, Any], algo: str) -> dict[str, Any]:
    """The card's block size (None for a drafter that fills no block, e.g. P-EAGLE's parallel
    drafting) and aux hidden-state layer ids, each read from the config key the algorithm's
    description names (:class:`specconv.format.algorithms.Algorithm` ``block_drafter``,
    ``aux_ids_key``); an algorithm specconv does not describe shows what its config holds."""
    from ..format.algorithms import find_algorithm

    alg = find_algorithm(algo)
    blocks = alg.block_drafter if alg is not None else "block_size" in cfg
    ids = cfg.get(alg.aux_ids_key if alg is not None else "aux_hidden_state_layer_ids")
    return {"block_size": cfg.get("block_size") if blocks else None,
            "aux_layer_ids": [str(i) for i in ids] if isinstance(ids, list) else []}


def positions_label(n: int) -> str:
    """``p₁…pₙ`` with subscript digits for ``n`` per-position acceptance rates (``p₁`` for one)."""
    sub = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
    return "p₁" if n == 1 else f"p₁…p{str(n).translate(sub)}"


def _sglang_section(d: Path, rec: Any, verifier: str, draft: str | None) -> dict[str, Any] | None:
    if draft is None:
        return None
    from ..engines.sglang.repo import card_section

    return card_section(d, rec, verifier, draft)


def gguf_section(d: Path, rec: Any, payload: Payload, draft_repo: str | None) -> dict[str, Any] | None:
    """The card's llama.cpp section, from the record's ``export.gguf`` (never recomputed), or
    None unless its llama-server check passed on the bytes that are there: for the pushed card
    (``draft_repo`` = the Hub repo) the push gate let ``gguf/<file>`` into ``payload``; for the
    local card (``draft_repo`` None) ``d/gguf/<file>`` has the recorded sha256.

    Returns:
        ``{command, commit, version, verifier_gguf, tau, spec_type, spec_draft_n_max, local}``.
    """
    from ..engines.vllm.serve_line import shell_command
    from ..engines.llamacpp.server import launch_argv
    from ..tensors import sha256_file

    exp = _gguf_export(rec)
    if exp is None:
        return None
    check, rel = exp.check or {}, f"gguf/{exp.file}"
    if not check.get("passed") or not (exp.verifier_gguf or {}).get("name"):
        return None
    there = (rel in payload.files) if draft_repo else (d / rel).is_file() and sha256_file(d / rel) == exp.sha256
    if not there:
        return None
    srv = check.get("llama_server") or {}
    return {"command": shell_command(launch_argv(exp, draft_repo)), "commit": srv.get("commit"),
            "version": srv.get("version"), "verifier_gguf": exp.verifier_gguf, "tau": _fmt(check.get("tau")),
            "spec_type": exp.spec_type, "spec_draft_n_max": exp.spec_draft_n_max, "local": draft_repo is None}


def _gguf_export(rec: Any) -> GgufExport | None:
    """The record's ``export.gguf`` (:class:`~specconv.results.GgufExport`), None when unset."""
    return rec.export.gguf if rec.export is not None else None


def _templates() -> Path:
    from specconv import templates

    return Path(templates.__file__).parent


def local_card_text(d: Path, rec: Any, repo_id: str) -> str:
    """The ``README.md`` text of drafter dir ``d`` (its ``config.json``, the files each engine's
    export lists for the local card) from its record ``rec``, naming it ``repo_id``.
    Deterministic: the same record and files give the same bytes; huggingface_hub's card
    check is left to push, which checks what it publishes.

    Raises:
        InvalidInputError: unreadable ``config.json``.
    """
    p = Payload()
    if any(x.is_dir() for x in d.iterdir()):  # a fresh conversion has no export: the registry is not asked
        for rel in sorted(rel for cap in exporters() for rel in cap.local_files(d)):
            p.files[rel] = d / rel
    gguf = _gguf_export(rec)
    shown = [*p.files, *([f"gguf/{gguf.file}"] if gguf is not None and gguf.file else [])]  # gguf_section decides
    p.contains_verifier_weights = contains_verifier_weights(d, rec, shown)
    from ..engines.sglang.repo import local_export_path

    return render_card(d, rec, p, repo_id, plot=False, check=False, sglang_draft=local_export_path(d, rec), local=True)


def write_local_card(d: Path, repo_id: str | None = None) -> Path:
    """Render the card into drafter dir ``d``'s own ``README.md`` from its record.

    ``specconv convert`` writes it inside its temp dir (:func:`conversion_card`); validate
    and export refresh it (:func:`refresh_local_card`); the published card is re-rendered
    by push anyway (``README.md`` is a derived file, exempt from the gates).

    Args:
        d: the drafter dir (holds ``config.json`` and ``specconv.json``).
        repo_id: the Hub id to name in the card (default: the dir's name).

    Returns:
        The path of ``README.md``.

    Raises:
        InvalidInputError: unreadable record, or metadata that does not parse.
    """
    from ..fileio import atomic_write
    from ..record import read_record

    d = Path(d)
    atomic_write(d / "README.md", local_card_text(d, read_record(d), repo_id or d.name).encode("utf-8"))
    return d / "README.md"


#: what a card that cannot be rendered raises (logged, never failing the stage that wrote the files)
_CARD_ERRORS = (SpecconvError, ImportError, OSError, ValueError)


def refresh_local_card(d: Path) -> Path | None:
    """:func:`write_local_card` for a dir specconv converted (its record has a conversion
    section; other dirs are left alone), logging (not raising) when the card cannot be
    rendered: the stage that called it has succeeded."""
    from ..record import read_record

    try:
        if read_record(Path(d), missing_ok=True).conversion is None:
            return None
        return write_local_card(d)
    except _CARD_ERRORS as e:
        log.warning("could not render %s/README.md: %s", d, e)
        return None


def conversion_card(repo_id: str):
    """The writer's card hook for a conversion into a dir named ``repo_id``
    (:func:`specconv.writer.write_plan` ``card=``): ``render(tmp_dir, record)`` returns the
    ``README.md`` text from the record the writer is about to write, or None (logged) when
    the card cannot be rendered."""

    def render(tmp: Path, rec: Any) -> str | None:
        try:
            return local_card_text(Path(tmp), rec, repo_id)
        except _CARD_ERRORS as e:
            log.warning("could not render %s/README.md: %s", repo_id, e)
            return None

    return render
