"""Load specconv output with the real speculators 0.9.0 library and run its forward.

Used by every "output loads in speculators and its forward runs" test (DFlash, DSpark,
P-EAGLE). Needs the peer packages (speculators 0.9.0 + loguru); callers mark their tests
``@pytest.mark.peer``.

How speculators loads a Speculators dir (``speculators/model.py``,
``SpeculatorModel.from_pretrained``): the config class is resolved from
``speculators_model_type``; the body comes from the dir's safetensors; the verifier-owned
tensors (``embed_tokens``, ``lm_head``, ``verifier_lm_head``, ``verifier_norm``) are then
reloaded from ``speculators_config.verifier.name_or_path`` (``load_verifier_weights`` →
``speculators.utils.loading.load_model_layers``), and the verifier's ``config.json`` is
read to pick the final-norm class (``models/utils.py::resolve_verifier_norm_class``).
Our output records the verifier's Hub id there and the Hub is unreachable, so the config
is loaded first, its verifier pointed at the local copy, and passed as ``config=``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Model attributes speculators fills from the verifier (or rebuilds) — never expected
#: in our body files when the draft vocab is the full vocab.
VERIFIER_OWNED = {"embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight"}


def _file_tensors(out_dir: Path) -> dict[str, Any]:
    """Every tensor of a Speculators dir (single file or shards), as torch tensors."""
    from safetensors.torch import load_file

    out_dir = Path(out_dir)
    index = out_dir / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    )
    tensors: dict[str, Any] = {}
    for f in files:
        tensors.update(load_file(str(out_dir / f)))
    return tensors


def load_with_speculators(out_dir, verifier_dir, *, attn_implementation: str = "eager", dtype=None, check: bool = True):
    """Load a Speculators dir with speculators 0.9.0 against a LOCAL verifier.

    Args:
        out_dir: our output directory (``config.json`` + safetensors).
        verifier_dir: local HF dir of the verifier (replaces the recorded Hub id in
            ``speculators_config.verifier.name_or_path`` for this load only).
        attn_implementation: draft attention backend (``eager`` runs on CPU without
            compiling flex-attention masks).
        dtype: torch dtype to load in (default ``torch.float32``).
        check: verify that every tensor of our files landed in the model unchanged (up
            to the dtype cast), that every model tensor not in our files is verifier-owned,
            and that no parameter is NaN (speculators initialises verifier-owned weights
            to NaN so a failed reload shows).

    Returns:
        the speculators model (``DFlashDraftModel`` / ``DSparkDraftModel`` /
        ``PEagleDraftModel``) in eval mode.

    Raises:
        AssertionError: a ``check`` failed (message names the tensor).
        whatever speculators raises when the dir does not load (size mismatch, bad config).
    """
    import torch
    from speculators import SpeculatorModel, SpeculatorModelConfig

    dtype = torch.float32 if dtype is None else dtype
    config = SpeculatorModelConfig.from_pretrained(str(out_dir))
    config.speculators_config.verifier.name_or_path = str(verifier_dir)
    config.transformer_layer_config._attn_implementation = attn_implementation  # noqa: SLF001
    model = SpeculatorModel.from_pretrained(str(out_dir), config=config, dtype=dtype)
    model.eval()
    if check:
        check_loaded(model, out_dir)
    return model


def check_loaded(model, out_dir) -> None:
    """Assert ``model`` holds exactly our files' tensors plus verifier-owned ones."""
    import torch

    state = model.state_dict()
    ours = _file_tensors(out_dir)
    # DFlash/DSpark always reload embed_tokens (and the full-vocab lm_head) from the
    # verifier, overwriting what a dir ships (models/dflash/core.py::load_verifier_weights)
    overwritten = VERIFIER_OWNED if model.config.speculators_model_type != "peagle" else set()
    for name, t in ours.items():
        assert name in state, f"{name} (in {out_dir}) is not a parameter of speculators' {type(model).__name__}"
        got = state[name]
        assert tuple(got.shape) == tuple(t.shape), f"{name}: loaded shape {tuple(got.shape)} != file {tuple(t.shape)}"
        if name in overwritten:
            continue
        want = t.to(got.dtype) if t.is_floating_point() else t
        assert torch.equal(got.cpu(), want), f"{name}: speculators holds different values than the file"
    missing = sorted(set(state) - set(ours) - VERIFIER_OWNED - {"t2d", "d2t"})
    assert not missing, f"speculators' {type(model).__name__} has tensors our output lacks: {missing}"
    for name, t in state.items():
        if t.is_floating_point():
            assert not torch.isnan(t).any(), f"{name} holds NaN after loading (never loaded?)"


def run_speculators_forward(model, *, seq_len: int | None = None, num_blocks: int = 2, seed: int = 0):
    """Run speculators' own training forward on small random inputs; return the draft logits.

    Inputs follow the shapes the forward documents: ``hidden_states [1, T, A·H]`` (the
    concatenated aux hidden states), ``input_ids [1, T]`` (verifier vocab),
    ``loss_mask``/``document_ids [1, T]`` and ``verifier_last_hidden_states [1, T, H]``.
    DFlash/DSpark draw ``num_blocks`` anchors (``max_anchors``), P-EAGLE samples its COD
    depths (``num_depths`` = the config's speculative tokens). The draft logits are the
    output of ``model.lm_head`` captured with a forward hook, so the forward runs
    unmodified.

    Returns:
        FloatTensor ``[1, N, draft_vocab_size]`` — N query slots (DFlash/DSpark:
        ``num_blocks·block_size``; P-EAGLE: sampled positions).

    Raises:
        AssertionError: logits or the loss are not finite, or logits have the wrong width.
    """
    import torch

    cfg = model.config
    algo = cfg.speculators_model_type
    H = cfg.transformer_layer_config.hidden_size
    V = cfg.transformer_layer_config.vocab_size
    if algo == "peagle":
        n_aux = len(cfg.eagle_aux_hidden_state_layer_ids or [0, 0, 0])
        T = seq_len or 12
    else:
        n_aux = len(cfg.aux_hidden_state_layer_ids)
        T = seq_len or (num_blocks + 2) * cfg.block_size
    p = next(model.parameters())
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(1, T, n_aux * H, generator=g).to(p.dtype)
    ids = torch.randint(0, V, (1, T), generator=g)
    last = torch.randn(1, T, H, generator=g).to(p.dtype)
    kw: dict[str, Any] = dict(
        hidden_states=hs,
        input_ids=ids,
        loss_mask=torch.ones(1, T),
        verifier_last_hidden_states=last,
        document_ids=torch.zeros(1, T, dtype=torch.long),
    )
    from speculators.losses import resolve_loss_config

    # the default loss kernels are Triton-fused (GPU only); eager runs anywhere
    kw["loss_config"] = resolve_loss_config("kl_div", "eager")
    if algo == "dspark":
        from speculators.losses import eager as eager_losses

        kw["tv_loss_fn"] = eager_losses.tv_loss
    if algo == "peagle":
        kw["num_depths"] = cfg.speculators_config.proposal_methods[0].speculative_tokens
    else:
        kw["max_anchors"] = num_blocks
    captured: list = []
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: captured.append(out.detach()))
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = model(**kw)
    finally:
        handle.remove()
    assert captured, "speculators' forward never called lm_head"
    logits = captured[-1]
    assert logits.shape[-1] == cfg.draft_vocab_size, (f"logits width {logits.shape[-1]} != draft vocab "
                                                      f"{cfg.draft_vocab_size}")
    assert torch.isfinite(logits).all(), "speculators' forward produced non-finite logits"
    loss = out[1] if isinstance(out, tuple) else None
    if isinstance(loss, torch.Tensor):
        assert torch.isfinite(loss).all(), f"speculators' forward produced a non-finite loss {loss}"
    return logits


__all__ = ["load_with_speculators", "run_speculators_forward", "check_loaded", "VERIFIER_OWNED"]
