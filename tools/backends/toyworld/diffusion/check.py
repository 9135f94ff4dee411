"""How well toyworld-sd draws its world, measured with the world's own readers (`sleuth world check --diffusion`).

- **Class accuracy**: the world's classifier on images of every class prompt.
- **Attribute adherence**: for a prompted background, colour, lighting or domain, the share of images in which the
  toy captioner reads the prompted value.
- **Null-text reconstruction**: PSNR between a generated image and its null-text inversion's reconstruction, beside
  the autoencoder's own round trip (the ceiling of any inversion) and the reconstruction against that round trip.
- **Background swaps**: prompt-to-prompt edits from one background to another (the editor's own sweep and LANCE
  filters); a swap succeeds when the captioner reads the new background and a classifier trained without shortcuts
  (the packaged ``nobugs`` world's) still sees the class it saw before the edit.

Rates come with 95% Wilson intervals.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from sleuth.tools.backends.sd_edit.ddim import psnr
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.oracle import CLASS_PROMPT
from sleuth.tools.stats import binomial_rate

Progress = Callable[[str, int, int], None]
SEED = 9_000_000
BACKGROUND = {"grass": "on the grass", "sand": "on the sand", "snow": "in the snow", "water": "in the water",
              "road": "on the road", "indoor": "indoors", "forest": "in the forest", "sky": "in the sky",
              "rock": "on the rocks"}
LIGHTING = {"day": "in daylight", "dusk": "at dusk", "night": "at night", "fog": "in the fog"}
DOMAIN = {"photo": "a realistic photograph of a {label}", "sketch": "a pencil sketch of a {label}",
          "painting": "a painting of a {label}"}
SWAPS = (("grass", "snow"), ("grass", "sand"), ("road", "snow"), ("indoor", "grass"), ("sand", "water"))


def attribute_prompt(attr: str, value: str, label: str) -> str:
    base = CLASS_PROMPT.format(label=label)
    if attr == "background":
        return f"{base} {BACKGROUND.get(value, 'in the ' + value)}"
    if attr == "colour":
        return CLASS_PROMPT.format(label=f"{value} {label}")
    if attr == "lighting":
        return f"{base} {LIGHTING.get(value, 'at ' + value)}"
    if attr == "domain":
        return DOMAIN.get(value, "a {label}").format(label=label)
    raise ValueError(attr)


def _rate(k: int, n: int) -> dict[str, Any]:
    r = binomial_rate(int(k), int(n))
    return {"k": r.k, "n": r.n, "rate": r.rate, "low": r.low, "high": r.high}


def _top1(classifier: Any, images: list[np.ndarray]) -> list[str]:
    labels = classifier.labels.labels
    return [labels[int(i)] for i in np.argmax(classifier.logits(images), axis=1)]


class DiffusionCheck:
    """The measurements, on a generator, an editor and the world's classifier and captioner."""

    def __init__(self, world: World, generator: Any, editor: Any, classifier: Any, captioner: Any, judge: Any,
                 progress: Progress | None = None, reconstruction_steps: int | None = 50) -> None:
        """``reconstruction_steps``: DDIM steps of the null-text reconstructions (50, as the check is defined;
        None: the editor's own). Swaps run at the editor's own steps, as investigations edit."""
        self.world = world
        self.reconstruction_steps = reconstruction_steps
        self.generator = generator
        self.editor = editor
        self.classifier = classifier
        self.captioner = captioner
        self.judge = judge
        self.progress = progress
        self.labels = list(world.labels.labels)

    def _tell(self, task: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(task, done, total)

    def _images(self, prompts: list[str], seeds: list[int], task: str, chunk: int = 64) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for start in range(0, len(prompts), chunk):
            gens = self.generator.generate(prompts[start:start + chunk], seeds[start:start + chunk])
            out.extend(np.asarray(g.image) for g in gens)
            self._tell(task, len(out), len(prompts))
        return out

    def accuracy(self, n: int, seed: int) -> dict[str, Any]:
        labels = [self.labels[i % len(self.labels)] for i in range(n)]
        images = self._images([CLASS_PROMPT.format(label=lab) for lab in labels], [seed + i for i in range(n)],
                              "class prompts")
        top1 = _top1(self.classifier, images)
        hits = [t == lab for t, lab in zip(top1, labels, strict=True)]
        by_class = {lab: _rate(sum(h for h, la in zip(hits, labels, strict=True) if la == lab), labels.count(lab))
                    for lab in self.labels}
        return {"overall": _rate(sum(hits), n), "by_class": by_class}

    def adherence(self, n: int, seed: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for a, attr in enumerate(("background", "colour", "lighting", "domain")):
            values = self.world.vocabulary.names(attr)
            rows = [(values[i % len(values)], self.labels[(i // len(values)) % len(self.labels)]) for i in range(n)]
            images = self._images([attribute_prompt(attr, v, lab) for v, lab in rows],
                                  [seed + 100_000 * (a + 1) + i for i in range(n)], f"{attr} prompts")
            read = [p[attr] for p in self.captioner.predict(images)]
            hits = [r == v for r, (v, _) in zip(read, rows, strict=True)]
            by_value = {v: _rate(sum(h for h, (vv, _) in zip(hits, rows, strict=True) if vv == v),
                                 sum(1 for vv, _ in rows if vv == v)) for v in values}
            out[attr] = {"overall": _rate(sum(hits), n), "by_value": by_value}
        return out

    def reconstruction(self, n: int, seed: int) -> dict[str, Any]:
        from sleuth.tools.backends.sd_edit.ddim import decode_latents, working_size
        from sleuth.tools.backends.sd_edit.inversion import invert, reconstruct

        pipe = self.editor.pipe
        labels = [self.labels[i % len(self.labels)] for i in range(n)]
        prompts = [CLASS_PROMPT.format(label=lab) for lab in labels]
        gens = self.generator.generate(prompts, [seed + 500_000 + i for i in range(n)])
        values, autoencoder, latent, seconds = [], [], [], []
        settings = self.editor.inversion_settings
        if self.reconstruction_steps is not None:
            settings = settings.model_copy(update={"steps": self.reconstruction_steps})
        for i, g in enumerate(gens):
            image = np.asarray(g.image)
            start = time.perf_counter()
            inv = invert(pipe, image, g.prompt, settings, working_size(image, pipe, None))
            z = reconstruct(pipe, inv)
            back = np.asarray(decode_latents(pipe, z)[0])
            seconds.append(time.perf_counter() - start)
            values.append(psnr(image, back))
            # The autoencoder's own round trip bounds what any inversion can reach.
            autoencoder.append(psnr(image, np.asarray(decode_latents(pipe, inv.z0)[0])))
            latent.append(psnr(np.asarray(decode_latents(pipe, inv.z0)[0]), back))
            self._tell("null-text inversions", i + 1, n)
        return {"n": n, "steps": settings.steps, "psnr_mean": float(np.mean(values)),
                "psnr_median": float(np.median(values)), "psnr_min": float(np.min(values)),
                "autoencoder_psnr_mean": float(np.mean(autoencoder)),
                "psnr_vs_autoencoder_mean": float(np.mean(latent)),
                "seconds_per_image": float(np.mean(seconds))}

    def swaps(self, n: int, seed: int) -> dict[str, Any]:
        rows = [(SWAPS[i % len(SWAPS)], self.labels[(i // len(SWAPS)) % len(self.labels)]) for i in range(n)]
        ok = passed = read_new = kept = 0
        for i, ((old, new), lab) in enumerate(rows):
            source = attribute_prompt("background", old, lab)
            target = attribute_prompt("background", new, lab)
            gen = self.generator.generate([source], [seed + 700_000 + i])[0]
            outcome = self.editor.edit(gen, source, target)
            edited = np.asarray(outcome.image)
            reads = self.captioner.predict([edited])[0]["background"] == new
            before, after = _top1(self.judge, [np.asarray(gen.image), edited])
            keeps = after == before
            read_new += reads
            kept += keeps
            ok += reads and keeps
            passed += bool(outcome.passed) and all(outcome.passed.values())
            self._tell("background swaps", i + 1, n)
        return {"swaps": [f"{a} -> {b}" for a, b in SWAPS], "success": _rate(ok, n),
                "new_background_read": _rate(read_new, n), "class_kept": _rate(kept, n),
                "filters_passed": _rate(passed, n)}

    def run(self, n: int = 1000, attribute_n: int = 240, inversions: int = 24, swaps: int = 60,
            seed: int = SEED) -> dict[str, Any]:
        start = time.perf_counter()
        report: dict[str, Any] = {"world": self.world.name, "generator": self.generator.id,
                                  "editor": self.editor.id}
        report["class_accuracy"] = self.accuracy(n, seed)
        report["attribute_adherence"] = self.adherence(attribute_n, seed)
        if inversions:
            report["null_text_reconstruction"] = self.reconstruction(inversions, seed)
        if swaps:
            report["background_swaps"] = self.swaps(swaps, seed)
        report["seconds"] = time.perf_counter() - start
        return report
