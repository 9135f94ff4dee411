"""Training the classifier (on the biased training distribution) and the attribute network (on broad renders).

Deterministic given the world config: fixed seeds, two torch threads, deterministic algorithms, data drawn by
counter-based hashing. Weights are cached by config hash; the packaged worlds' weights ship in ``weights/``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from sleuth.tools.backends.base import BackendError
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.nets import AttributeNet, ClassifierNet, to_tensor
from sleuth.tools.backends.toyworld.parser import ParsedPrompt, Scene, sample_scenes
from sleuth.tools.backends.toyworld.render import Renderer

Progress = Callable[[str, int, int], None]
HEADS = ("background", "colour", "co_object", "co_colour", "lighting", "domain")
# Co-occurring objects are small and learned last: their heads weigh more so that they are learned at all.
HEAD_WEIGHTS = {"co_object": 3.0, "co_colour": 2.0}
THREADS = 2
CHUNK = 2000


def head_sizes(world: World) -> dict[str, int]:
    return {h: len(world.vocabulary.names(h)) for h in HEADS}


def training_scenes(world: World, n_per_class: int, seed: int, distribution: str) -> list[Scene]:
    """``n_per_class`` scenes of every class, on a seed space of their own (salted apart from generated images)."""
    scenes: list[Scene] = []
    salt = world.seed + 1_000_003 * (seed + 1) + (0 if distribution == "training" else 7)
    for i, label in enumerate(world.labels.labels):
        seeds = np.arange(n_per_class, dtype=np.int64) + i * 10_000_000
        scenes.extend(sample_scenes(ParsedPrompt({}, [], label), seeds, world, distribution, salt=salt))
    return scenes


def render_dataset(world: World, scenes: list[Scene], input_size: int, progress: Progress | None,
                   task: str) -> torch.Tensor:
    """Render and downsample to uint8 ``(N, 3, s, s)`` (kept small in memory)."""
    renderer = Renderer(world)
    out = torch.empty((len(scenes), 3, input_size, input_size), dtype=torch.uint8)
    for start in range(0, len(scenes), CHUNK):
        imgs = renderer.render(scenes[start:start + CHUNK])
        x = to_tensor(imgs, input_size)
        out[start:start + len(imgs)] = ((x * 0.25 + 0.5).clamp(0, 1) * 255 + 0.5).to(torch.uint8)
        if progress is not None:
            progress(task, min(start + CHUNK, len(scenes)), len(scenes))
    return out


def _from_uint8(x: torch.Tensor) -> torch.Tensor:
    return (x.float() / 255.0 - 0.5) / 0.25


class _Deterministic:
    """Two threads, deterministic kernels, restored afterwards."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        self.det = torch.are_deterministic_algorithms_enabled()
        torch.set_num_threads(THREADS)
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.threads)
        torch.use_deterministic_algorithms(self.det)


def _fit(model: torch.nn.Module, data: torch.Tensor, targets: dict[str, torch.Tensor], epochs: int,
         batch_size: int, lr: float, seed: int, progress: Progress | None, task: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    n = len(data)
    steps = epochs * ((n + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.2)
    model.train()
    step = 0
    for epoch in range(epochs):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            out = model(_from_uint8(data[idx]))
            if isinstance(out, dict):
                # A batch without any visible co-object colour has nothing to learn for that head (and a loss
                # over zero targets would be NaN).
                loss = sum(HEAD_WEIGHTS.get(k, 1.0) * F.cross_entropy(out[k], t[idx], ignore_index=-1)
                           for k, t in targets.items() if bool((t[idx] >= 0).any()))
            else:
                loss = F.cross_entropy(out, targets["label"][idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[union-attr]
            opt.step()
            sched.step()
            step += 1
        if progress is not None:
            progress(task, epoch + 1, epochs)
    model.eval()


def train_classifier(world: World, progress: Progress | None = None) -> ClassifierNet:
    cfg = world.classifier_training
    with _Deterministic():
        torch.manual_seed(cfg.seed)
        scenes = training_scenes(world, cfg.n_per_class, cfg.seed, "training")
        data = render_dataset(world, scenes, cfg.input_size, progress, "rendering classifier data")
        labels = world.labels.labels
        y = torch.tensor([labels.index(s.label) for s in scenes])
        model = ClassifierNet(len(labels), input_size=cfg.input_size)
        _fit(model, data, {"label": y}, cfg.epochs, cfg.batch_size, cfg.lr, cfg.seed, progress,
             "training classifier")
    return model


def attribute_targets(world: World, scenes: list[Scene]) -> dict[str, torch.Tensor]:
    out = {}
    for h in HEADS:
        names = world.vocabulary.names(h)
        vals = [names.index(getattr(s, h)) for s in scenes]
        if h == "co_colour":  # only flowers, balls and nets show their colour
            vals = [v if s.co_object in ("flower", "ball", "net") else -1 for v, s in zip(vals, scenes)]
        out[h] = torch.tensor(vals)
    return out


def train_captioner(world: World, progress: Progress | None = None) -> AttributeNet:
    cfg = world.captioner_training
    with _Deterministic():
        torch.manual_seed(cfg.seed)
        scenes = training_scenes(world, cfg.n_per_class, cfg.seed, "broad")
        data = render_dataset(world, scenes, cfg.input_size, progress, "rendering captioner data")
        model = AttributeNet(head_sizes(world), input_size=cfg.input_size)
        _fit(model, data, attribute_targets(world, scenes), cfg.epochs, cfg.batch_size, cfg.lr, cfg.seed,
             progress, "training captioner")
    return model


# -- weights -------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    root = os.environ.get("SLEUTH_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "sleuth") / "toyworld"


def shipped_path(world: World) -> Path:
    return Path(str(resources.files("sleuth.tools.backends.toyworld").joinpath(f"weights/{world.name}.safetensors")))


def shipped_by_hash(config_hash: str) -> Path:
    """Shipped weights of a world known only by its config: the benchmark's random worlds (``random:20``, seeds
    0-19) ship theirs, so that every machine benchmarks the same classifiers (training on a CPU is not bit-identical
    across machines) and none spends the hour training them."""
    root = resources.files("sleuth.tools.backends.toyworld").joinpath("weights/random")
    return Path(str(root.joinpath(f"{config_hash}.safetensors")))


def _hash_of(path: Path) -> str | None:
    with safe_open(str(path), framework="pt") as f:
        return (f.metadata() or {}).get("config_hash")


def find_weights(world: World) -> Path | None:
    """Shipped weights whose config hash matches (by the world's name, else by its config hash), else cached ones,
    else None."""
    h = world.config_hash()
    for shipped in (shipped_path(world), shipped_by_hash(h)):
        if shipped.is_file() and _hash_of(shipped) == h:
            return shipped
    cached = cache_dir() / f"{h}.safetensors"
    return cached if cached.is_file() else None


def state_dicts(world: World, progress: Progress | None = None) -> dict[str, torch.Tensor]:
    """Both networks' weights (prefixed ``classifier.`` / ``captioner.``): found, or trained and cached."""
    path = find_weights(world)
    if path is None:
        tensors = train_all(world, progress)
        path = cache_dir() / f"{world.config_hash()}.safetensors"
        save_weights(tensors, world, path)
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def borrowed_captioner(world: World, progress: Progress | None = None) -> dict[str, torch.Tensor]:
    """The attribute network of the packaged world ``world.captioner_from`` (unprefixed), after checking it can
    read this world's images: same vocabulary, image size and network input."""
    from sleuth.tools.backends.toyworld.config import load_world

    assert world.captioner_from is not None
    donor = load_world(world.captioner_from)
    if donor.captioner_from is not None:
        raise BackendError(f"world {world.name}: captioner_from {donor.name!r} borrows its own captioner")
    for what, mine, theirs in (("vocabulary", world.vocabulary, donor.vocabulary), ("size", world.size, donor.size),
                               ("captioner_training", world.captioner_training, donor.captioner_training)):
        if mine != theirs:
            raise BackendError(f"world {world.name}: captioner_from {donor.name!r} has another {what}")
    tensors = state_dicts(donor, progress)
    return {k.removeprefix("captioner."): v for k, v in tensors.items() if k.startswith("captioner.")}


def train_all(world: World, progress: Progress | None = None) -> dict[str, torch.Tensor]:
    clf = train_classifier(world, progress)
    tensors = {f"classifier.{k}": v for k, v in clf.state_dict().items()}
    if world.captioner_from is not None:
        cap_state = borrowed_captioner(world, progress)
    else:
        cap_state = train_captioner(world, progress).state_dict()
    tensors.update({f"captioner.{k}": v for k, v in cap_state.items()})
    return {k: v.detach().clone().contiguous() for k, v in tensors.items()}


def save_weights(tensors: dict[str, torch.Tensor], world: World, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    save_file(tensors, tmp, metadata={"config_hash": world.config_hash(), "world": world.name})
    os.chmod(tmp, 0o644)  # mkstemp makes it private; weights are shared files
    os.replace(tmp, path)


def load_prefixed(module: torch.nn.Module, tensors: dict[str, torch.Tensor], prefix: str) -> None:
    module.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
    module.eval()
