"""A content-addressed store for images and other blobs: ``root/ab/abcdef….png``, ref = sha256 of the bytes.

The same image always gives the same PNG bytes (fixed encoder options, no metadata), hence the same ref, so
storing twice costs nothing and transcripts can name images by ref alone.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

_REF = re.compile(r"^[0-9a-f]{64}$")
_EXT = re.compile(r"^[a-z0-9]{1,10}$")


class ArtifactStore:
    """Blobs under ``root``, named by the sha256 of their bytes."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # -- images ------------------------------------------------------------------------------------------

    def put_image(self, img: np.ndarray) -> str:
        """Store an RGB ``uint8`` image ``(H, W, 3)`` as PNG; returns its ref."""
        arr = np.asarray(img)
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
            raise ValueError(f"expected a uint8 RGB image of shape (H, W, 3), got {arr.dtype} {arr.shape}")
        buf = io.BytesIO()
        # Fixed options and no metadata chunks: the bytes depend on the pixels only.
        Image.fromarray(np.ascontiguousarray(arr), mode="RGB").save(buf, format="PNG", compress_level=6,
                                                                     optimize=False)
        return self.put_bytes(buf.getvalue(), ext="png")

    def get_image(self, ref: str) -> np.ndarray:
        with Image.open(self.path(ref)) as im:
            return np.array(im.convert("RGB"), dtype=np.uint8)

    # -- any blob ----------------------------------------------------------------------------------------

    def put_bytes(self, data: bytes, ext: str = "bin") -> str:
        """Store ``data`` as ``<sha256>.<ext>``; returns the ref (the sha256)."""
        if not _EXT.match(ext):
            raise ValueError(f"artifact extension must be 1-10 lowercase letters or digits, got {ext!r}")
        ref = hashlib.sha256(data).hexdigest()
        target = self._dir(ref) / f"{ref}.{ext}"
        if target.exists():
            return ref
        target.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename: a reader never sees a half-written file, and concurrent writers of the same blob
        # both end with identical bytes in place.
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{ref[:8]}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return ref

    def get_bytes(self, ref: str) -> bytes:
        return self.path(ref).read_bytes()

    def path(self, ref: str) -> Path:
        """The file of ``ref``; ``KeyError`` when the store does not hold it."""
        found = self._find(ref)
        if found is None:
            raise KeyError(f"no artifact {ref!r} in {self.root}" if _REF.match(str(ref))
                           else f"{ref!r} is not an artifact ref (expected 64 hex digits)")
        return found

    def exists(self, ref: str) -> bool:
        return self._find(ref) is not None

    def _dir(self, ref: str) -> Path:
        return self.root / ref[:2]

    def _find(self, ref: str) -> Path | None:
        if not isinstance(ref, str) or not _REF.match(ref):
            return None
        png = self._dir(ref) / f"{ref}.png"
        if png.exists():
            return png
        return next(iter(sorted(self._dir(ref).glob(f"{ref}.*"))), None) if self._dir(ref).is_dir() else None
