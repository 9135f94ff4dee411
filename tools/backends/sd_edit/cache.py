"""Inversions cached per image, so several edits of one image cost one inversion.

An inversion depends on the image's pixels, the prompt it was inverted under, the model, the size it was
edited at and the inversion settings; the key hashes all of them. Entries live in memory (least recently
used dropped first) and, when a directory is given, on disk as safetensors files that outlive the process.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sleuth.tools.backends.base import Image
from sleuth.tools.backends.sd_edit.inversion import Inversion, InversionSettings


def inversion_key(image: Image, prompt: str, settings: InversionSettings, model_id: str,
                  size: tuple[int, int]) -> str:
    a = np.ascontiguousarray(np.asarray(image, dtype=np.uint8))
    h = hashlib.sha256()
    h.update(repr(a.shape).encode())
    h.update(a.tobytes())
    # "schedule": inversions made before null-text optimisation followed the official schedule are not reused.
    h.update(json.dumps({"prompt": prompt, "settings": settings.model_dump(), "model": model_id,
                         "size": list(size), "schedule": "official"}, sort_keys=True).encode())
    return h.hexdigest()


class InversionCache:
    """Memory LRU of inversions, optionally backed by a directory."""

    def __init__(self, max_items: int = 16, directory: str | Path | None = None) -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self.max_items = max_items
        self.directory = Path(directory).expanduser() if directory is not None else None
        self._items: OrderedDict[str, Inversion] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> Inversion | None:
        inv = self._items.get(key)
        if inv is None and self.directory is not None:
            inv = self._load(key)
            if inv is not None:
                self._remember(key, inv)
        if inv is not None:
            self._items.move_to_end(key)
        return inv

    def put(self, key: str, inv: Inversion) -> None:
        self._remember(key, inv)
        if self.directory is not None:
            self._save(key, inv)

    def get_or_compute(self, key: str, compute: Callable[[], Inversion]) -> tuple[Inversion, bool]:
        """The cached inversion and True, or a fresh one (now cached) and False."""
        inv = self.get(key)
        if inv is not None:
            self.hits += 1
            return inv, True
        self.misses += 1
        inv = compute()
        self.put(key, inv)
        return inv, False

    def _remember(self, key: str, inv: Inversion) -> None:
        self._items[key] = inv
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def _path(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{key}.safetensors"

    def _save(self, key: str, inv: Inversion) -> None:
        from safetensors.torch import save_file

        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = {"prompt": inv.prompt, "settings": inv.settings.model_dump_json(), "size": json.dumps(list(inv.size)),
                "seconds": repr(inv.seconds), "reconstruction_mse": json.dumps(inv.reconstruction_mse)}
        tensors = {"latent": inv.latent.detach().cpu().contiguous(), "nulls": inv.nulls.detach().cpu().contiguous(),
                   "z0": inv.z0.detach().cpu().contiguous()}
        if inv.reconstruction is not None:
            tensors["reconstruction"] = inv.reconstruction.detach().cpu().contiguous()
        # Written beside, then renamed: a reader never sees half a file.
        tmp = self._path(key).with_suffix(f".{os.getpid()}.tmp")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(self._path(key))

    def _load(self, key: str) -> Inversion | None:
        from safetensors import SafetensorError, safe_open

        path = self._path(key)
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                t = {k: f.get_tensor(k) for k in ("latent", "nulls", "z0", "reconstruction") if k in f.keys()}
        except (SafetensorError, OSError):
            return None  # an unreadable entry is recomputed, and overwritten
        if not {"latent", "nulls", "z0"} <= t.keys():
            return None
        size = json.loads(meta["size"])
        return Inversion(t["latent"], t["nulls"], t["z0"], meta["prompt"],
                         InversionSettings.model_validate_json(meta["settings"]), (int(size[0]), int(size[1])),
                         float(meta["seconds"]), json.loads(meta["reconstruction_mse"]), t.get("reconstruction"))
