"""SGLang loader check — the script that runs INSIDE the SGLang interpreter (a subprocess; imports
nothing from specconv). Usage: ``python runner.py JOB.json RESULT.json``; the job, the strict CPU
load, the stubs and the result: ``docs/engines.md`` ("The runner").
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import time
import traceback
import types

#: SGLang's draft-model families (``srt/models/dflash.py``, ``dspark.py``, ``llama_eagle3.py``).
FAMILY_DFLASH = "dflash"
FAMILY_DSPARK = "dspark"
FAMILY_EAGLE3 = "eagle3"
#: ``architectures[0]`` → (family, ``ServerArgs.speculative_algorithm``), ``srt/models/registry.py``.
DRAFT_CLASSES = {"DFlashDraftModel": (FAMILY_DFLASH, None), "DFlash2DraftModel": (FAMILY_DFLASH, None),
                 "Qwen3DSparkModel": (FAMILY_DSPARK, None),
                 "DSparkDraftModel": (FAMILY_DSPARK, None), "LlamaForCausalLMEagle3": (FAMILY_EAGLE3, "EAGLE3")}
#: The ``vllm._custom_ops`` functions SGLang's layers import off CUDA (never called by a load).
VLLM_OPS = ("rotary_embedding", "rms_norm", "fused_add_rms_norm")
RAGGED_VERIFY_MODE = "compact"
#: ``__version__`` of a stubbed package.
STUB_VERSION = "0.0.0+specconv.stub"
SGLANG_VERSION: str | None = None


# ------------------------------------------------------------------ stubs
class StubLog:
    """What each stub was asked for: ``{stub name: {"reason", "used": [attribute, ...]}}``."""

    def __init__(self) -> None:
        self.stubs: dict[str, dict] = {}

    def add(self, name: str, reason: str) -> None:
        self.stubs[name] = {"name": name, "reason": reason, "used": []}

    def use(self, name: str, attr: str) -> None:
        used = self.stubs[name]["used"]
        if attr not in used:
            used.append(attr)

    def report(self) -> list[dict]:
        return [dict(v, used=sorted(v["used"])) for v in self.stubs.values()]


STUBS = StubLog()


def _placeholder(qualname: str) -> type:
    """A class standing for ``qualname``: attribute access yields more placeholders, calling it raises."""

    class Meta(type):
        def __getattr__(cls, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _placeholder(f"{qualname}.{attr}")

        def __call__(cls, *a, **kw):
            raise RuntimeError(f"{qualname} is a specconv stub (torchvision is not usable here); it must not be called")

    return Meta(qualname.rpartition(".")[2] or qualname, (), {"__module__": qualname.rpartition(".")[0]})


class _StubModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        STUBS.use(self.__name__.split(".")[0], f"{self.__name__}.{attr}")
        return _placeholder(f"{self.__name__}.{attr}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``root`` and every ``root.*`` import as a :class:`_StubModule`."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.root and not fullname.startswith(self.root + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        STUBS.use(self.root, spec.name)
        return _StubModule(spec.name)

    def exec_module(self, module) -> None:
        module.__path__ = []
        if module.__name__ == self.root:
            # transformers treats a findable package as available and parses its version
            # (``is_torchvision_greater_or_equal``); a version below every check keeps it off.
            module.__version__ = STUB_VERSION


def _import_error(name: str) -> str | None:
    """Why ``import name`` fails here (None when it works); leaves no half-imported modules."""
    try:
        __import__(name)
        return None
    except ModuleNotFoundError as e:
        reason = f"not installed ({e})"
    except Exception as e:  # noqa: BLE001 - e.g. a CUDA-only torchvision on CPU torch
        reason = f"import fails: {_err(e)}"
    for mod in [m for m in sys.modules if m == name.split(".")[0] or m.startswith(name.split(".")[0] + ".")]:
        del sys.modules[mod]
    return reason


def _vllm_ops_module() -> types.ModuleType:
    def stub(fn_name):
        def fn(*a, **kw):
            STUBS.use("vllm._custom_ops", f"{fn_name} (CALLED)")
            raise RuntimeError(f"vllm._custom_ops.{fn_name} is a specconv stub; loading must not call it")
        fn.__name__ = fn_name
        return fn

    class Ops(types.ModuleType):
        def __getattr__(self, attr):
            if attr not in VLLM_OPS:
                raise AttributeError(f"vllm._custom_ops.{attr} (not stubbed)")
            STUBS.use("vllm._custom_ops", attr)
            return stub(attr)

    pkg, ops = types.ModuleType("vllm"), Ops("vllm._custom_ops")
    pkg.__path__, pkg.__spec__ = [], importlib.machinery.ModuleSpec("vllm", None, is_package=True)
    ops.__spec__ = importlib.machinery.ModuleSpec("vllm._custom_ops", None)
    vars(pkg)["_custom_ops"] = ops  # a module attribute ModuleType does not declare
    sys.modules["vllm"], sys.modules["vllm._custom_ops"] = pkg, ops
    return ops


def apply_stubs() -> list[dict]:
    """Stub ``torchvision`` and ``vllm._custom_ops`` where they do not import. Returns the log."""
    reason = _import_error("torchvision")
    if reason:
        STUBS.add("torchvision", reason)
        sys.meta_path.insert(0, _StubFinder("torchvision"))
    reason = _import_error("vllm._custom_ops")
    if reason:
        STUBS.add("vllm._custom_ops", reason + f"; stubbed: {', '.join(VLLM_OPS)}")
        _vllm_ops_module()
    return STUBS.report()


def environment() -> dict:
    """Versions the check ran with (``distribution``: the installed distribution's name)."""
    from importlib import metadata

    import sglang
    import torch
    import transformers

    try:
        dist = metadata.distribution("sglang").metadata["Name"]
    except metadata.PackageNotFoundError:
        dist = None
    return {"distribution": dist, "sglang": sglang.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": sys.version.split()[0],
            "SGLANG_RAGGED_VERIFY_MODE": os.environ.get("SGLANG_RAGGED_VERIFY_MODE")}


# ------------------------------------------------------------------ load recording
class Recorder:
    """Checkpoint tensors yielded to ``load_weights`` and the ones that reached a weight loader (matched
    by object identity, then data pointer, then as the tensor yielded last)."""

    def __init__(self) -> None:
        self._clear(active=False)

    def reset(self) -> None:
        self._clear(active=True)

    def _clear(self, *, active: bool) -> None:
        self.active = active
        self.yielded: list[str] = []
        self.consumed: set[str] = set()
        self.by_id: dict[int, str] = {}
        self.by_ptr: dict[int, str] = {}

    def record(self, weights):
        """Wrap the checkpoint iterator."""
        for name, t in weights:
            self.yielded.append(name)
            self.by_id[id(t)] = name
            self.by_ptr[_ptr(t)] = name
            yield name, t

    def name_of(self, t) -> str | None:
        return self.by_id.get(id(t)) or self.by_ptr.get(_ptr(t)) or (self.yielded[-1] if self.yielded else None)

    def wrap(self, model) -> None:
        """Poison every floating parameter with NaN and wrap its weight loader."""
        import torch
        from sglang.srt.model_loader.weight_utils import default_weight_loader

        for name, p in model.named_parameters():
            if p.is_floating_point():
                with torch.no_grad():
                    p.fill_(float("nan"))
            orig = getattr(p, "weight_loader", None) or default_weight_loader

            def wl(param, loaded_weight, *args, _n=name, _o=orig, **kw):
                src = self.name_of(loaded_weight)
                try:
                    out = _o(param, loaded_weight, *args, **kw)
                except (AssertionError, RuntimeError, ValueError) as e:
                    raise ValueError(f"loading {_n} {tuple(param.shape)} from {src} {tuple(loaded_weight.shape)}: "
                                     f"{_err(e)}") from e
                if src is not None:
                    self.consumed.add(src)
                return out

            p.weight_loader = wl


def _ptr(t) -> int:
    try:
        return int(t.data_ptr())
    except Exception:  # noqa: BLE001 - meta / odd tensors
        return -1


RECORDER = Recorder()


def install_recorder() -> None:
    """Patch SGLang's ``DefaultModelLoader.load_weights_only`` (the one call between model
    construction and ``model.load_weights``) to poison, wrap and record while active."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    orig = DefaultModelLoader.load_weights_only

    def load_weights_only(model, weights, target_device):
        if RECORDER.active:
            RECORDER.wrap(model)
            weights = RECORDER.record(weights)
        return orig(model, weights, target_device)

    DefaultModelLoader.load_weights_only = staticmethod(load_weights_only)


# ------------------------------------------------------------------ SGLang set-up
_DIST_READY = False


def server_args(draft: str, verifier: str, algorithm: str | None, dtype: str):
    """The ``ServerArgs`` a CPU load needs (``attention_backend="torch_native"``, no CUDA graph)."""
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=verifier, device="cpu", dtype=dtype, speculative_algorithm=algorithm,
                      speculative_draft_model_path=draft, attention_backend="torch_native",
                      disable_cuda_graph=True)


def publish_and_init(sa) -> None:
    """Publish ``sa`` as the process's config (rank 0) and, once, a one-process gloo group on loopback."""
    global _DIST_READY
    from sglang.srt.runtime_context import SpawnRanks, publish

    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0))
    if _DIST_READY:
        return
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    fd, path = tempfile.mkstemp(prefix="specconv-sglang-gloo-")
    os.close(fd)
    os.unlink(path)
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"file://{path}")
    initialize_model_parallel()
    _DIST_READY = True


def load_draft(sa, draft: str):
    """SGLang's draft ``ModelConfig`` and ``get_model()`` on CPU. Returns (model_config, model)."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model

    mc = ModelConfig.from_server_args(sa, model_path=draft, is_draft_model=True)
    model = get_model(model_config=mc, load_config=LoadConfig(load_format="auto"), device_config=DeviceConfig("cpu"))
    return mc, model


def verifier_layers(sa) -> int:
    """The verifier's ``num_hidden_layers`` from SGLang's own ``ModelConfig``."""
    from sglang.srt.configs.model_config import ModelConfig

    return int(ModelConfig.from_server_args(sa).hf_text_config.num_hidden_layers)


# ------------------------------------------------------------------ resolved values
def resolved_block_values(hf_config, model, family: str, n_target: int) -> dict:
    """What SGLang resolved for a DFlash / DSpark draft (the worker's rules; docs/engines.md, "The runner")."""
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    cfg = parse_dflash_draft_config(draft_hf_config=hf_config)
    ids = cfg.resolve_target_layer_ids(target_num_layers=n_target, draft_num_layers=cfg.require_num_layers())
    out = {"block_size": int(model.block_size), "block_size_in_config": cfg.block_size,
           "mask_token": cfg.mask_token, "mask_token_id": cfg.mask_token_id, "num_target_layers": cfg.num_target_layers,
           **_layer_attention(model)}
    if family == FAMILY_DSPARK:
        markov = _markov_values(hf_config, model)
        own = markov.pop("target_layer_ids")
        ids = own if own is not None else ids
        out.update(markov)
    else:
        rows = dflash_draft_rows(int(model.block_size))
        # srt/speculative/dflash_worker_v2.py: one pass verifies the block; its rows 1.. are drafted
        out.update(draft_rows=rows, block_slots=int(model.block_size), drafts_per_block=len(rows),
                   sample_from_anchor=rows[:1] == [0], **_dflash2_values(cfg, model))
    out.update(captured_layer_ids=[int(i) for i in ids], capture_layer_inputs=[int(i) + 1 for i in ids],
               verifier_layers=n_target)
    return out


def _markov_values(hf_config, model) -> dict:
    """DSpark: γ, the query rows (``dspark_worker_v2.py``: γ with ``sample_from_anchor``, else
    γ + 1), the Markov head and whether the confidence head was built."""
    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config

    ds = parse_dspark_draft_config(draft_hf_config=hf_config)
    gamma, sfa = int(model.gamma), bool(model.sample_from_anchor)
    return {"mask_token_id": ds.mask_token_id, "sample_from_anchor": sfa, "markov_rank": ds.markov_rank,
            "markov_head_type": ds.markov_head_type, "gamma": gamma, "block_slots": gamma if sfa else gamma + 1,
            "drafts_per_block": gamma, "confidence_head": model.confidence_head is not None,
            "target_layer_ids": list(ds.target_layer_ids) if ds.target_layer_ids is not None else None}


def _dflash2_values(cfg, model) -> dict:
    """The convolution / selector settings SGLang parsed and whether it built the modules; nothing when the
    draft enables neither (0 = off: a plain DFlash draft)."""
    if not (cfg.conv_kernel_size or cfg.selector_rank):
        return {}
    layers = getattr(model, "layers", [])
    return {"conv_kernel_size": cfg.conv_kernel_size, "conv_group_size": cfg.conv_group_size,
            "selector_rank": cfg.selector_rank, "selector_top_k": cfg.selector_top_k,
            "convolutions_built": sum(getattr(x, "attention_conv", None) is not None for x in layers),
            "candidate_selector_built": getattr(model, "candidate_selector", None) is not None}


def _layer_attention(model) -> dict:
    """Per draft layer: causal (SGLang's ``AttentionType``) and the sliding window it stores."""
    causal, window = [], []
    for layer in getattr(model, "layers", []):
        attn = getattr(layer, "self_attn", None)
        kind = getattr(getattr(attn, "attn_type", None), "value", None)
        causal.append(kind == "decoder" if kind is not None else None)
        window.append(getattr(attn, "sliding_window_size", None))
    return {"layer_causal": causal, "sliding_window_left": window}


def dflash_draft_rows(block_size: int) -> list[int]:
    """The block rows SGLang's DFlash draft sampler turns into draft tokens, found by running
    it (``srt/speculative/dflash_worker_v2.py`` ``_DflashDraftSampler``, the greedy head of the
    draft graph) on a block whose row ``j`` can only yield token ``j``."""
    import torch
    from sglang.srt.speculative.dflash_worker_v2 import _DflashDraftSampler

    eye = torch.eye(block_size, dtype=torch.float32)
    sampler = _DflashDraftSampler(weight=eye, block_size=block_size, num_org=block_size, org_vocab_start=0, max_bs=1)
    sampler(eye)
    return [int(t) for t in sampler.out[: block_size - 1]]


def resolved_eagle3_values(hf_config, n_target: int) -> dict:
    """EAGLE-3: the aux ids SGLang passes to ``set_eagle3_layers_to_capture`` (None: its default)."""
    eagle = getattr(hf_config, "eagle_config", None) or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    return {"captured_layer_ids": ids, "capture_layer_inputs": [int(i) + 1 for i in ids] if ids else None,
            "draft_vocab_size": getattr(hf_config, "draft_vocab_size", None), "verifier_layers": n_target,
            "block_size": None, "mask_token_id": None, "sample_from_anchor": None}


# ------------------------------------------------------------------ one dir
def strict_compare(model, recorder: Recorder, target_supplied=()) -> dict:
    """Parameters still holding NaN (unfilled) and checkpoint tensors no weight loader took
    (``target_supplied`` ones listed apart)."""
    import torch

    unfilled = [n for n, p in model.named_parameters() if p.is_floating_point() and bool(torch.isnan(p).any())]
    unconsumed = [n for n in dict.fromkeys(recorder.yielded) if n not in recorder.consumed]
    return {"unfilled_params": unfilled, "unconsumed_tensors": [n for n in unconsumed if n not in target_supplied],
            "target_supplied_skipped": [n for n in unconsumed if n in target_supplied],
            "params": sum(1 for _ in model.parameters()), "checkpoint_tensors": len(set(recorder.yielded))}


def check_one(job: dict, dtype: str) -> dict:
    """Config, strict SGLang load and the resolved values of one dir, under the check's ``env``
    (default ``SGLANG_RAGGED_VERIFY_MODE=compact``); ``serve_argv`` (the words after
    ``python -m sglang.launch_server``) is parsed by SGLang's own argument parser."""
    d = os.path.abspath(job["dir"])
    res = {"dir": d, "verifier": job["verifier"], "ok": False, "errors": []}
    t0 = time.monotonic()
    env = dict(job["env"]) if "env" in job else {"SGLANG_RAGGED_VERIFY_MODE": RAGGED_VERIFY_MODE}
    wanted = {"SGLANG_RAGGED_VERIFY_MODE": None, **env}  # not named: unset (SGLang's default, static)
    saved = {k: os.environ.get(k) for k in wanted}
    try:
        _set_environ(wanted)
        res["env"] = env
        _load_one(job, d, dtype, res)
    finally:
        _set_environ(saved)
    if job.get("serve_argv") is not None:
        try:
            res["serve_args"] = parse_serve_argv(job["serve_argv"], env)
        except BaseException as e:  # noqa: BLE001 - argparse exits with SystemExit on a bad line
            res["errors"].append(f"SGLang's argument parser: {_err(e)}")
    return _done(res, t0)


def _set_environ(values: dict) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _load_one(job: dict, d: str, dtype: str, res: dict) -> None:
    """The load itself (``res`` gets the class, the resolved values, the strictness lists)."""
    try:
        with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
            arch = (json.load(f).get("architectures") or [None])[0]
        if arch not in DRAFT_CLASSES:
            raise ValueError(f"architectures[0] {arch!r} is not an SGLang draft class ({', '.join(DRAFT_CLASSES)})")
        family, algorithm = DRAFT_CLASSES[arch]
        res.update(architecture=arch, family=family, speculative_algorithm=algorithm)
        sa = server_args(d, job["verifier"], algorithm, dtype)
        publish_and_init(sa)
        n_target = verifier_layers(sa)
    except Exception as e:  # noqa: BLE001 - one dir's failure is its result
        return _fail(res, "SGLang config", e)
    RECORDER.reset()
    try:
        mc, model = load_draft(sa, d)
    except Exception as e:  # noqa: BLE001
        return _fail(res, "SGLang get_model()", e)
    finally:
        RECORDER.active = False
    res["class"] = type(model).__name__
    res["sglang"], res["stubs_used"] = SGLANG_VERSION, [s["name"] for s in STUBS.report() if s["used"]]
    try:
        res["resolved"] = (resolved_eagle3_values(mc.hf_config, n_target) if family == FAMILY_EAGLE3
                           else resolved_block_values(mc.hf_config, model, family, n_target))
    except Exception as e:  # noqa: BLE001
        return _fail(res, "SGLang draft config", e)
    res.update(strict_compare(model, RECORDER, job.get("target_supplied") or ()))
    if res["unfilled_params"]:
        res["errors"].append(f"parameters the checkpoint did not fill: {', '.join(res['unfilled_params'])}")
    if res["unconsumed_tensors"]:
        res["errors"].append(f"checkpoint tensors no weight loader took: {', '.join(res['unconsumed_tensors'])}")
    del model
    return None


def parse_serve_argv(argv: list, env: dict) -> dict:
    """What SGLang's own parser (``srt/server_args.py``: ``ServerArgs.add_cli_args``, as
    ``prepare_server_args`` builds it) reads from a serve line, and whether its
    ``SGLANG_RAGGED_VERIFY_MODE`` is one SGLang knows (``srt/speculative/ragged_verify.py``)."""
    import argparse

    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.ragged_verify import RaggedVerifyMode

    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args([str(a) for a in argv])
    mode = env.get("SGLANG_RAGGED_VERIFY_MODE")
    return {"model_path": ns.model_path, "speculative_algorithm": ns.speculative_algorithm,
            "speculative_draft_model_path": ns.speculative_draft_model_path,
            "ragged_verify_mode": mode,
            "ragged_verify_mode_known": mode is None or mode in {m.value for m in RaggedVerifyMode}}


def _fail(res: dict, stage: str, e: BaseException) -> None:
    res["errors"].append(f"{stage}: {_err(e)}")
    res["traceback"] = traceback.format_exc()[-4000:]


def _done(res: dict, t0: float) -> dict:
    res["ok"] = not res["errors"]
    res["seconds"] = round(time.monotonic() - t0, 3)
    return res


def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:500]


def main(argv: list[str]) -> int:
    """``runner.py JOB.json [RESULT.json]``: without RESULT.json the result is printed on stdout."""
    global SGLANG_VERSION
    job_path, out_path = argv[1], (argv[2] if len(argv) > 2 else None)
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    os.environ["SGLANG_RAGGED_VERIFY_MODE"] = RAGGED_VERIFY_MODE
    t0 = time.monotonic()
    try:
        apply_stubs()
        env = environment()
        SGLANG_VERSION = env["sglang"]
        install_recorder()
    except Exception as e:  # noqa: BLE001
        _write(out_path,
               {"env": {"stubs": STUBS.report()}, "fatal": _err(e), "traceback": traceback.format_exc()[-4000:]})
        return 1
    env["import_seconds"] = round(time.monotonic() - t0, 3)
    results = [check_one(c, job.get("dtype", "float32")) for c in job["checks"]]
    env["stubs"] = STUBS.report()
    _write(out_path, {"env": env, "results": results})
    return 0


def _write(path: str | None, obj: dict) -> None:
    if path is None:
        print(json.dumps(obj, indent=2, sort_keys=True, default=str))
        return
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
