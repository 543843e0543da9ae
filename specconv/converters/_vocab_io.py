"""Reading draft-vocabulary mapping tensors (``d2t`` / ``t2d``): arrays and side files (docs/adding_a_converter.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specconv.errors import InvalidInputError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

#: Names a mapping file may use for each tensor (vLLM's names included).
D2T_KEYS = ("d2t", "draft_id_to_target_id")
T2D_KEYS = ("t2d", "target_id_to_draft_id")

#: Side files looked for beside a checkpoint (besides speculators' cached ``d2t-{Vd}.npy``).
SIDE_FILES = {"d2t": ("d2t.npy", "d2t.pt"), "t2d": ("t2d.npy", "t2d.pt")}


def as_array(x: Any, *, what: str = "tensor") -> np.ndarray:
    """``x`` (array, torch tensor, list or ``(TensorStore, name)``) as a 1-D numpy array; ``what`` labels errors.

    Raises:
        InvalidInputError: ``x`` is not 1-D or is a float tensor.
    """
    import numpy as np

    if isinstance(x, tuple) and len(x) == 2 and hasattr(x[0], "read_tensor"):
        store, name = x
        info = store.info(name)
        try:
            arr = store.read_numpy(name)
        except ValueError:
            arr = store.read_tensor(name).numpy()
        what = f"{what} ({name}, {info.dtype})"
    elif hasattr(x, "detach") and hasattr(x, "numpy"):  # torch.Tensor
        arr = x.detach().cpu().numpy()
    else:
        arr = np.asarray(x)
    if arr.ndim != 1:
        raise InvalidInputError(f"{what} must be 1-D, got shape {list(arr.shape)}", code="vocab_map_invalid")
    if arr.dtype.kind == "f":
        raise InvalidInputError(f"{what} must be an integer or bool tensor, got {arr.dtype}", code="vocab_map_invalid")
    return arr


def _load_pt(path: Path) -> Any:
    from specconv.tensors.dtypes import import_torch

    torch = import_torch()
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # UnpicklingError for non-allow-listed globals, junk files
        from specconv.tensors import torch_load_error_detail

        raise InvalidInputError(
            f"{path}: torch.load(weights_only=True) failed ({torch_load_error_detail(e)}); "
            "specconv never unpickles arbitrary objects — save the mapping as .npy or .safetensors",
            code="unsafe_pickle",
        ) from e


def _pick(d: Mapping[str, Any], keys: Iterable[str]) -> Any:
    for k in keys:
        if k in d:
            return d[k]
    # one level of nesting (e.g. {"vocab_mapping": {"d2t":..., "t2d":...}})
    for v in d.values():
        if isinstance(v, Mapping):
            got = _pick(v, keys)
            if got is not None:
                return got
    return None


def read_mapping_file(path: str | Path, *, role: str | None = None,
                      draft_vocab_size: int | None = None) -> dict[str, np.ndarray]:
    """``{"d2t": int array, "t2d": bool/int array}`` (whichever was found) from a side file or a directory of
    them (accepted files: docs/adding_a_converter.md); ``role`` names a single ``.npy`` array's role.

    Raises:
        InvalidInputError: unreadable file, unknown extension, neither tensor present (naming the file).
    """
    p = Path(path)
    if p.is_dir():
        return _read_mapping_dir(p, draft_vocab_size)
    if not p.is_file():
        raise InvalidInputError(f"vocab mapping file {p} does not exist", code="vocab_map_missing")
    name = p.name.lower()
    reader = next((r for ext, r in _READERS if name.endswith(ext)), None)
    if reader is None:
        raise InvalidInputError(f"{p}: unknown vocab mapping file type (expected .safetensors, .pt, .npy or .npz)",
                                code="vocab_map_invalid")
    out = reader(p, role)
    if not out:
        raise InvalidInputError(f"{p} holds neither d2t nor t2d", code="vocab_map_invalid")
    return out


def _read_mapping_dir(p: Path, draft_vocab_size: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r, f in find_side_files(p, draft_vocab_size).items():
        out[r] = read_mapping_file(f, role=r)[r]
    if not out:
        from specconv.tensors import TensorStore

        try:
            store = TensorStore.open(p)
        except InvalidInputError:
            store = None
        if store is not None:
            out = _from_store(store, p)
    if not out:
        raise InvalidInputError(f"{p}: no d2t/t2d side files (d2t.npy, d2t-<Vd>.npy, t2d.npy, ...) or tensors",
                                code="vocab_map_invalid")
    return out


def _from_store(store: Any, p: Path) -> dict[str, Any]:
    out = {}
    for r, keys in (("d2t", D2T_KEYS), ("t2d", T2D_KEYS)):
        k = next((k for k in keys if k in store), None)
        if k is not None:
            out[r] = as_array((store, k), what=f"{p}:{k}")
    return out


def _role_of_single(p: Path, arr: Any, role: str | None) -> str:
    """The role of a file holding one array: ``role``, the file name, or bool dtype → t2d."""
    import numpy as np

    if role:
        return role
    for r in ("d2t", "t2d"):
        if r in p.name.lower():
            return r
    if as_array(arr, what=str(p)).dtype == np.bool_:
        return "t2d"
    raise InvalidInputError(f"{p}: a single integer array, cannot tell whether it is d2t or t2d; name the file "
                            "d2t.* / t2d.*", code="vocab_map_invalid")


def _read_safetensors(p: Path, role: str | None) -> dict[str, Any]:
    from specconv.tensors import TensorStore

    return _from_store(TensorStore.open(p), p)


def _read_pt(p: Path, role: str | None) -> dict[str, Any]:
    obj = _load_pt(p)
    if isinstance(obj, Mapping):
        out = {}
        for r, keys in (("d2t", D2T_KEYS), ("t2d", T2D_KEYS)):
            v = _pick(obj, keys)
            if v is not None:
                out[r] = as_array(v, what=f"{p}:{r}")
        return out
    if hasattr(obj, "numpy"):
        return {_role_of_single(p, obj, role): as_array(obj, what=str(p))}
    raise InvalidInputError(f"{p}: expected a dict with d2t/t2d or a tensor, found {type(obj).__name__}",
                            code="vocab_map_invalid")


def _read_npz(p: Path, role: str | None) -> dict[str, Any]:
    import numpy as np

    out = {}
    try:
        with np.load(p, allow_pickle=False) as z:
            for r, keys in (("d2t", D2T_KEYS), ("t2d", T2D_KEYS)):
                k = next((k for k in keys if k in z.files), None)
                if k is not None:
                    out[r] = as_array(z[k], what=f"{p}:{k}")
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"{p}: cannot read .npz ({e})", code="vocab_map_invalid") from e
    return out


def _read_npy(p: Path, role: str | None) -> dict[str, Any]:
    import numpy as np

    try:
        arr = np.load(p, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"{p}: cannot read .npy ({e})", code="vocab_map_invalid") from e
    return {_role_of_single(p, arr, role): as_array(arr, what=str(p))}


#: file suffix → reader (``path, role`` → ``{role: array}``).
_READERS = ((".safetensors", _read_safetensors), (".pt", _read_pt), (".pth", _read_pt), (".bin", _read_pt),
            (".npz", _read_npz), (".npy", _read_npy))


def find_side_files(directory: Path, draft_vocab_size: int | None = None) -> dict[str, Path]:
    """``{"d2t": path, "t2d": path}`` for side files in ``directory`` (either may be absent; order: docs)."""
    d = Path(directory)
    found = {}
    for role, names in SIDE_FILES.items():
        cands = [d / n for n in names]
        if draft_vocab_size is not None:
            cands.append(d / f"{role}-{draft_vocab_size}.npy")
        else:
            cached = sorted(d.glob(f"{role}-*.npy"))
            if len(cached) == 1:
                cands.append(cached[0])
        for f in cands:
            if f.is_file():
                found[role] = f
                break
    return found
