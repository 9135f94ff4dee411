"""Artifact images as data URIs for the report: small PNGs as stored, large ones as thumbnails."""

from __future__ import annotations

import base64
import io
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from sleuth.tools.artifacts import ArtifactStore


class Embedded:
    """One image ready for an ``<img>``: its data URI and natural size."""

    def __init__(self, uri: str, width: int, height: int) -> None:
        self.uri = uri
        self.width = width
        self.height = height


def png_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


class ImageEmbedder:
    """Reads artifacts of one run; images larger than ``max_side`` are shrunk so a report of real 512 px
    generations stays a few megabytes. Each ref is read once per report."""

    def __init__(self, artifacts: Path, max_side: int = 160) -> None:
        self.store = ArtifactStore(artifacts)
        self.max_side = max_side
        self.missing: list[str] = []
        self._seen: dict[str, Embedded | None] = {}

    def get(self, ref: str) -> Embedded | None:
        if ref not in self._seen:
            self._seen[ref] = self._load(ref)
            if self._seen[ref] is None:
                self.missing.append(ref)
        return self._seen[ref]

    def _load(self, ref: str) -> Embedded | None:
        try:
            path = self.store.path(ref)
            data = path.read_bytes()
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                fmt, size = im.format, im.size
                if fmt == "PNG" and max(size) <= self.max_side:
                    return Embedded(png_uri(data), *size)
                small = im.convert("RGB")
        except (KeyError, OSError, UnidentifiedImageError):
            # Unreadable or absent: the report says so rather than failing.
            return None
        small.thumbnail((self.max_side, self.max_side), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        small.save(buf, format="PNG", optimize=False)
        return Embedded(png_uri(buf.getvalue()), *small.size)
