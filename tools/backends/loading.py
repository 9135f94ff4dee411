"""Shared loading rules for real-model backends.

Weights come from a local path or the Hugging Face cache, never from the network: a model that is not
on disk is a `BackendError` naming it and saying how to fetch it, raised at once instead of a hang.
Devices default to CPU and dtypes to float32, as diffusers does; anything else is asked for explicitly.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sleuth.tools.backends.base import BackendError, Image

DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "half": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}


def hf_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def fetch_hint(repo_id: str) -> str:
    return (f"Fetch it on a machine with network with `hf download {repo_id}` (it lands in the Hugging Face "
            f"cache, {hf_cache_dir()}), or pass a local folder.")


def looks_like_repo_id(ref: str) -> bool:
    parts = ref.split("/")
    return len(parts) == 2 and all(parts) and not ref.startswith((".", "/", "~"))


def resolve_pretrained(ref: str, *, what: str) -> Path:
    """A local folder or file for ``ref``: a packaged model (``toyworld-sd``, ``toyworld-clip``), the path itself, or
    the cached snapshot of a Hub repo id.

    ``what`` names the model kind in the error ("diffusers pipeline", "BLIP captioner", ...). The cache is
    only read (``local_files_only``), whatever ``HF_HUB_OFFLINE`` says, so a missing model fails at once.
    """
    from sleuth.tools.backends.packaged import packaged

    folder = packaged(ref)
    if folder is not None:
        return folder
    path = Path(ref).expanduser()
    if path.exists():
        return path
    if not looks_like_repo_id(ref):
        raise BackendError(f"{what} {ref!r} not found: no such file or folder.")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(ref, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError):
        raise BackendError(f"{what} {ref!r} is not a local path and not in the Hugging Face cache. "
                           f"{fetch_hint(ref)}") from None


def resolve_hub_file(repo_id: str, filenames: Sequence[str], *, what: str) -> Path:
    """The first of ``filenames`` present in the cached snapshot of ``repo_id``."""
    folder = resolve_pretrained(repo_id, what=what)
    for name in filenames:
        if (folder / name).is_file():
            return folder / name
    raise BackendError(f"{what} {repo_id!r}: none of {', '.join(filenames)} in the cached snapshot {folder}. "
                       f"{fetch_hint(repo_id)}")


FINGERPRINT_WHOLE = 64 << 20
"""Files up to this size (64 MiB: every packaged model's) are fingerprinted on their whole contents."""
FINGERPRINT_ENDS = 1 << 20
"""Of larger files, this many bytes at each end."""


def fingerprint(path: Path) -> str:
    """A short tag that changes when the weights at ``path`` change, for cache keys and run records.

    A Hugging Face cache snapshot is named by its commit, which is used as is; a local file or folder is hashed on
    its files' names, sizes and contents: whole files up to ``FINGERPRINT_WHOLE`` bytes, the first and last
    ``FINGERPRINT_ENDS`` bytes of larger ones (a safetensors file opens with its tensors' header). The same weights
    have the same tag on every machine and in every copy, so a run on them replays anywhere.
    """
    path = path.resolve()
    if path.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", path.name):
        return path.name[:12]
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(path).as_posix() if f != path else f.name}|{size}|".encode())
        with f.open("rb") as fh:
            if size <= FINGERPRINT_WHOLE:
                h.update(hashlib.sha256(fh.read()).digest())
            else:
                head = fh.read(FINGERPRINT_ENDS)
                fh.seek(size - FINGERPRINT_ENDS)
                h.update(hashlib.sha256(head + fh.read(FINGERPRINT_ENDS)).digest())
    return h.hexdigest()[:12]


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Silence the progress bars and advice diffusers / transformers print while loading (library code never
    prints; the caller reports progress), restoring their settings afterwards."""
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog

    saved = [(m, m.is_progress_bar_enabled(), m.get_verbosity()) for m in (dlog, tlog)]
    for m, _, _ in saved:
        m.disable_progress_bar()
        m.set_verbosity_error()
    try:
        yield
    finally:
        for m, bars, level in saved:
            if bars:
                m.enable_progress_bar()
            m.set_verbosity(level)


def load_diffusion_pipeline(folder: Path | str, dtype: Any, what: str) -> Any:
    """A diffusers pipeline from a local folder (never the network), quietly; ``what`` names it in the one-line
    ``BackendError`` a folder that does not hold one gives."""
    from diffusers import DiffusionPipeline

    with quiet_loading():
        try:
            return DiffusionPipeline.from_pretrained(folder, dtype=dtype, local_files_only=True)
        except (OSError, ValueError) as e:
            raise BackendError(f"{what}: cannot load from {folder}: {str(e).splitlines()[0]}") from None


def dtype_tag(dtype: Any) -> str:
    """``""`` for float32, else ``":float16"`` etc.: appended to backend ids, since precision changes outputs."""
    name = str(dtype).removeprefix("torch.")
    return "" if name == "float32" else f":{name}"


def choose_device(device: str = "cpu") -> Any:
    """``torch.device`` for ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``auto`` (the best one present)."""
    import torch

    name = device.strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise BackendError(f"unknown device {device!r}: use cpu, cuda, cuda:N, mps or auto.") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendError(f"device {device!r} asked for but CUDA is not available; use --device cpu.")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise BackendError(f"device {device!r} asked for but MPS is not available; use --device cpu.")
    return dev


def choose_dtype(dtype: str | None, device: Any) -> Any:
    """float32 unless asked otherwise; float16 only off the CPU, where it is slow or unsupported."""
    import torch

    if dtype is None:
        return torch.float32
    key = DTYPES.get(dtype.strip().lower())
    if key is None:
        raise BackendError(f"unknown dtype {dtype!r}: use one of {', '.join(sorted(set(DTYPES.values())))}.")
    if key == "float16" and getattr(device, "type", str(device)) == "cpu":
        raise BackendError("float16 needs a GPU; on CPU use float32 or bfloat16.")
    return getattr(torch, key)


def load_state_dict(path: Path, *, what: str) -> dict[str, Any]:
    """Tensors of a checkpoint file (.safetensors, or a torch pickle read with ``weights_only``).

    Training checkpoints often wrap the weights (``state_dict``/``model``) or carry a DataParallel
    ``module.`` prefix; both are unwrapped so plain and wrapped files load alike.
    """
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return dict(load_file(str(path)))
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        raise BackendError(f"{what}: cannot read checkpoint {path}: {str(e).splitlines()[0]}") from None
    for key in ("state_dict", "model_state_dict", "model", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise BackendError(f"{what}: {path} does not hold a state dict of tensors.")
    if all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return obj


def check_images(images: Sequence[Image]) -> list[np.ndarray]:
    """The images as uint8 RGB arrays; anything else is a caller bug, reported plainly."""
    out = []
    for i, im in enumerate(images):
        a = np.asarray(im)
        if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
            raise ValueError(f"image {i}: expected uint8 (H, W, 3), got {a.dtype} {a.shape}")
        out.append(a)
    return out


def to_pil(images: Sequence[Image]) -> list[Any]:
    from PIL import Image as PILImage

    return [PILImage.fromarray(a) for a in check_images(images)]


def batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, max(size, 1))]
