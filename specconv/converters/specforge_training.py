"""SpecForge training checkpoints ``<output_dir>/<run_id>-step<N>/`` (sgl-project/SpecForge
``specforge/training/checkpoint.py``; docs/formats.md, docs/adding_a_converter.md)."""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from specconv.errors import InvalidInputError, UnsupportedFormatError
from specconv.fileio import read_json_object

from .base import Converter, SourceInfo, refuse_unsupported_layer_keys, register

STATE_FILE = "training_state.pt"
#: SpecForge's ``strategy`` values (``specforge/training/checkpoint.py``): source facts, named once.
STRATEGY_DFLASH = "dflash"
STRATEGY_DSPARK = "dspark"
STRATEGY_PEAGLE = "peagle"
STRATEGY_EAGLE3 = "eagle3"
STRATEGY_DOMINO = "domino"
#: SpecForge strategy → Speculators algorithm (None: no Speculators equivalent).
STRATEGIES: dict[str, str | None] = {STRATEGY_DFLASH: "dflash", STRATEGY_DSPARK: "dspark", STRATEGY_PEAGLE: "peagle",
                                     STRATEGY_EAGLE3: None, STRATEGY_DOMINO: None}
PREFIXES = ("draft_model.", "_orig_mod.", "module.")


def export_hint(path: Path) -> str:
    return (
        f"python -m specforge.export.to_hf --checkpoint {path} --draft-config <the draft config .json used for "
        "training> --output-dir <export dir> [--vocab-mapping <file>]"
    )


def strip_prefixes(name: str) -> str:
    """Remove wrapper prefixes (``draft_model.``, ``_orig_mod.``, ``module.``, in any order) and inner \
``._orig_mod.``."""
    changed = True
    while changed:
        changed = False
        for p in PREFIXES:
            if name.startswith(p):
                name, changed = name[len(p):], True
        if "._orig_mod." in name:  # torch.compile'd submodules
            name, changed = name.replace("._orig_mod.", "."), True
    return name


def load_training_state(path: Path) -> dict[str, Any]:
    """``torch.load(path, weights_only=False)`` — call only after the user's explicit opt-in.

    Raises:
        InvalidInputError: unreadable pickle (missing classes, corrupt file) or not a dict.
    """
    from specconv.tensors.dtypes import import_torch

    torch = import_torch()
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except RuntimeError:  # legacy (non-zip) serialization cannot be mmapped
            state = torch.load(path, map_location="cpu", weights_only=False)
    except ModuleNotFoundError as e:
        raise InvalidInputError(
            f"{path}: unpickling needs the module {e.name!r} (SpecForge objects in the training state); "
            "export the checkpoint with SpecForge instead",
            code="unpickle_failed",
            hint=export_hint(path.parent),
        ) from e
    except Exception as e:
        raise InvalidInputError(
            f"{path}: cannot load the training state ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''})",
            code="unpickle_failed",
        ) from e
    if not isinstance(state, dict):
        raise InvalidInputError(f"{path}: expected a dict, found {type(state).__name__}", code="unpickle_failed")
    return state


def draft_state_dict(state: dict[str, Any], path: Path) -> dict[str, Any]:
    """The draft tensors with wrapper prefixes stripped (``{name: torch.Tensor}``).

    Raises:
        InvalidInputError: no ``draft_state_dict``, non-tensor entries, or two keys that
            collide after stripping.
    """
    from specconv.tensors.dtypes import import_torch

    torch = import_torch()
    sd = state.get("draft_state_dict")
    if not isinstance(sd, dict) or not sd:
        raise InvalidInputError(
            f"{path}: no draft_state_dict in the training state (keys: {sorted(map(str, state))[:12]})",
            code="missing_key",
        )
    out: dict[str, Any] = {}
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise InvalidInputError(f"{path}: draft_state_dict[{k!r}] is a {type(v).__name__}, not a tensor")
        name = strip_prefixes(str(k))
        if name in out:
            raise InvalidInputError(f"{path}: draft_state_dict keys collide on {name!r} after "
                                    "stripping wrapper prefixes")
        if hasattr(v, "full_tensor"):  # DTensor saved un-gathered
            v = v.full_tensor()
        out[name] = v.detach().cpu().contiguous()
    return out


def read_draft_config(p: Path) -> dict[str, Any]:
    p = Path(p)
    if p.is_dir():
        p = p / "config.json"
    return read_json_object(p, unreadable="--draft-config {path}: cannot read JSON ({error})",
                            not_object="--draft-config {path} is not a JSON object")


def materialise(sd: dict[str, Any], cfg: dict[str, Any]) -> Path:
    """Write ``config.json`` + ``model.safetensors`` to a fresh private temp dir; return it."""
    from safetensors.torch import save_file

    tmp = Path(tempfile.mkdtemp(prefix="specconv-specforge-"))
    try:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


@register
class SpecForgeTraining(Converter):
    format_id = "specforge_training"
    algorithm = "dflash|dspark|peagle"
    title = "SpecForge training checkpoint (training_state.pt pickle, no config.json)"
    detection = "no `config.json`, a `training_state.pt` file (dir `<run_id>-step<N>`)"
    mapping = (
        "refused unless `--allow-unpickle` AND `--draft-config` are given (then `training_state.pt` is loaded with "
        "weights_only=False, `draft_state_dict` prefixes `draft_model.`/`_orig_mod.` stripped, and the `strategy`'s "
        "export mapping applies: dflash → zlab_dflash, dspark → specforge_dspark, peagle → SpecForge P-EAGLE); "
        "otherwise run SpecForge's HF export: `python -m specforge.export.to_hf --checkpoint … --draft-config … "
        "--output-dir …`"
    )
    refusal = (
        "training_state.pt is a pickle (unpickling runs code); export it with "
        "`python -m specforge.export.to_hf --checkpoint DIR --draft-config CFG --output-dir OUT` and convert OUT, "
        "or opt in with --allow-unpickle --draft-config CFG for a file you trust"
    )
    spec_ref = "sgl-project/SpecForge `specforge/training/checkpoint.py`"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return src.config is None and STATE_FILE in src.files

    def plan(self, src, verifier, opts):
        state_path = src.path / STATE_FILE
        if not (opts.allow_unpickle and opts.draft_config):
            missing = [f for f, ok in (("--allow-unpickle", opts.allow_unpickle),
                                       ("--draft-config", opts.draft_config)) if not ok]
            raise UnsupportedFormatError(
                f"{src.path} is a SpecForge training checkpoint: {STATE_FILE} is a pickle (loading it runs arbitrary "
                f"code) and there is no config.json. Export it with SpecForge first:\n  {export_hint(src.path)}\n"
                f"and convert the export dir; or, for a file you trust, pass {' and '.join(missing)} "
                "(both are required to load it here)",
                format_id=self.format_id,
                code="needs_export",
            )
        cfg = read_draft_config(opts.draft_config)
        refuse_unsupported_layer_keys(src, self.format_id, cfg=cfg, file=opts.draft_config)  # before unpickling
        state = load_training_state(state_path)
        strategy, algo = _strategy(state, state_path, opts)
        sd = draft_state_dict(state, state_path)
        tmp = materialise(sd, cfg)
        del sd
        sub = SourceInfo.open(tmp)
        weakref.finalize(sub.store, shutil.rmtree, str(tmp), True)
        cls = _export_converter(sub, src, opts, cfg, strategy, algo)
        plan = cls().plan(sub, verifier, opts)
        # The pipeline reads non-produced tensors from ``src.store``: point it at the
        # materialised safetensors (the training dir itself has none).
        src._store = sub.store
        plan.format_id = self.format_id
        plan.source_dir = src.path
        plan.source_files = [src.path / f for f in src.files]
        plan.notes[:0] = [
            f"{STATE_FILE} unpickled with torch.load(weights_only=False): explicit --allow-unpickle opt-in",
            f"strategy {strategy!r}, global_step {state.get('global_step')}, epoch {state.get('epoch')}, "
            f"run_id {state.get('run_id')!r}",
            f"draft config from --draft-config {opts.draft_config}; mapped as {cls.format_id} ({cls.title})",
        ]
        return plan


def _strategy(state: dict[str, Any], state_path: Path, opts: Any) -> tuple[str, str]:
    """``(strategy, target algorithm)``; EAGLE-3 / Domino strategies and ``--algorithm``
    contradictions are refused."""
    strategy = state.get("strategy")
    if strategy not in STRATEGIES:
        raise InvalidInputError(
            f"{state_path}: unknown or missing strategy {strategy!r} (expected one of {', '.join(STRATEGIES)})",
            code="missing_key",
        )
    algo = STRATEGIES[strategy]
    if algo is None:
        raise UnsupportedFormatError(
            f"{state_path}: SpecForge strategy {strategy!r} has no Speculators equivalent "
            + ("(EAGLE-3: use `speculators convert --algorithm eagle3` on a `to_hf` export)"
               if strategy == STRATEGY_EAGLE3 else "(Domino's GRU head cannot be expressed)"),
            format_id=strategy,
        )
    if opts.algorithm and opts.algorithm != algo:
        raise InvalidInputError(
            f"--algorithm {opts.algorithm} given but {state_path} was trained with strategy {strategy!r} ({algo})",
            code="algorithm_mismatch",
        )
    return strategy, algo


def _export_converter(sub: SourceInfo, src: SourceInfo, opts: Any, cfg: dict[str, Any], strategy: str,
                      algo: str) -> type[Converter]:
    """The converter of the strategy's export format, detected on the materialised dir."""
    from specconv.converters import detect

    cls = detect(sub)
    if cls is None or cls is SpecForgeTraining:
        raise InvalidInputError(
            f"--draft-config {opts.draft_config}: not a recognised {strategy} draft config "
            f"(architectures={cfg.get('architectures')})",
            code="draft_config_mismatch",
        )
    if not cls.supported:
        raise UnsupportedFormatError(
            f"{src.path} (with --draft-config {opts.draft_config}) is {cls.title} ({cls.format_id}): {cls.refusal}",
            format_id=cls.format_id,
        )
    if cls.algorithm != algo:
        raise InvalidInputError(
            f"training strategy {strategy!r} ({algo}) but --draft-config {opts.draft_config} describes "
            f"{cls.title} ({cls.algorithm})",
            code="draft_config_mismatch",
        )
    return cls
