"""The captioner: an attribute network reads the scene from the pixels (never from the scene record) and writes
caption sentences in the style of Wiles et al. ("it is in the snow.", "the background is white.").

``sentence_loglik`` scores a sentence by the log-probability the network gives the attribute values the sentence
asserts (parsed with the same parser as prompts), minus a penalty per word it cannot see: Wiles et al.'s greedy
sentence selection then prefers sentences that are true of most images in a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sleuth.tools.backends.base import BackendError, Image
from sleuth.tools.backends.toyworld.config import World
from sleuth.tools.backends.toyworld.nets import AttributeNet, to_tensor
from sleuth.tools.backends.toyworld.parser import Lexicon, parse
from sleuth.tools.backends.toyworld.train import HEADS, Progress, head_sizes, load_prefixed, state_dicts

BATCH = 1024
UNSEEN_WORD_PENALTY = 1.5
"""Log-likelihood charged per word the captioner cannot ground in the image."""
EMPTY_SENTENCE_LOGLIK = -3.0
"""A sentence asserting nothing visible is unlikely as a description."""
PLACES = {"grass": "it is on the grass", "sand": "it is on the sand", "snow": "it is in the snow",
          "water": "it is in the water", "road": "it is on the road", "indoor": "it is indoors",
          "forest": "it is in the forest", "sky": "it is in the sky", "rock": "it is on the rocks"}
LIGHTS = {"dusk": "it is at dusk", "night": "it is at night", "fog": "it is in the fog"}
DOMAINS = {"sketch": "it is a pencil sketch", "painting": "it is a painting"}


class ToyCaptioner:
    """Captions and sentence likelihoods from a multi-head attribute network."""

    def __init__(self, world: World, device: str = "cpu", progress: Progress | None = None) -> None:
        self.world = world
        self.device = torch.device(device)
        self.id = f"toyworld-captioner:{world.name}:{world.config_hash()[:8]}"
        self.progress = progress
        self._net: AttributeNet | None = None
        self._lexicon = Lexicon(world)
        self.values = {h: world.vocabulary.names(h) for h in HEADS}

    @property
    def net(self) -> AttributeNet:
        if self._net is None:
            net = AttributeNet(head_sizes(self.world), input_size=self.world.captioner_training.input_size)
            load_prefixed(net, state_dicts(self.world, self.progress), "captioner.")
            self._net = net.to(self.device)
        return self._net

    def _run(self, images: Sequence[Image] | np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        size = self.world.captioner_training.input_size
        net = self.net  # outside inference mode: a new world trains here on first use
        feats: list[np.ndarray] = []
        probs: dict[str, list[np.ndarray]] = {h: [] for h in HEADS}
        with torch.inference_mode():
            for start in range(0, len(images), BATCH):
                try:
                    x = to_tensor(images[start:start + BATCH], size).to(self.device)
                except ValueError as e:
                    raise BackendError(f"{self.id}: {e}") from None
                f = net.features(x)
                feats.append(f.cpu().numpy())
                for h in HEADS:
                    probs[h].append(torch.softmax(net.heads[h](f), dim=1).cpu().numpy())
        return np.concatenate(feats), {h: np.concatenate(v) for h, v in probs.items()}

    def features(self, images: Sequence[Image] | np.ndarray) -> np.ndarray:
        return self._run(images)[0]

    def attributes(self, images: Sequence[Image] | np.ndarray) -> dict[str, np.ndarray]:
        """p(value | image) per attribute: ``{attribute: (N, n_values)}``."""
        return self._run(images)[1]

    def predict(self, images: Sequence[Image] | np.ndarray) -> list[dict[str, str]]:
        probs = self.attributes(images)
        return [{h: self.values[h][int(np.argmax(probs[h][i]))] for h in HEADS} for i in range(len(images))]

    def _subject(self, class_prompt: str) -> str:
        label = parse(class_prompt, self.world, self._lexicon).label
        return f"the {label}" if label else "it"

    def captions(self, images: Sequence[Image], class_prompt: str) -> list[list[str]]:
        if len(images) == 0:
            return []
        subject = self._subject(class_prompt)
        probs = self.attributes(images)
        bg_colour = {v.name: v.colour_words[0] for v in self.world.vocabulary.background if v.colour_words}
        out = []
        for i in range(len(images)):
            a = {h: self.values[h][int(np.argmax(probs[h][i]))] for h in HEADS}
            sents = [PLACES.get(a["background"], f"the background is {a['background']}")]
            if a["background"] in bg_colour:
                sents.append(f"the background is {bg_colour[a['background']]}")
            order = np.argsort(-probs["background"][i])
            second = self.values["background"][int(order[1])]
            if probs["background"][i][order[1]] > 0.25:
                sents.append(PLACES.get(second, f"the background is {second}"))
            sents.append(f"{subject} is {a['colour']}")
            co, cc = a["co_object"], a["co_colour"]
            if co == "flower":
                sents.append(f"it is on a {cc} flower")
            elif co == "net":
                sents.append("it is in a net")
            elif co == "person":
                sents.append("there is a person next to it")
            elif co == "ball":
                sents.append(f"there is a {cc} ball next to it")
            if a["lighting"] in LIGHTS:
                sents.append(LIGHTS[a["lighting"]])
            if a["domain"] in DOMAINS:
                sents.append(DOMAINS[a["domain"]])
            out.append(sents)
        return out

    def sentence_loglik(self, images: Sequence[Image], sentence: str, class_prompt: str) -> np.ndarray:
        if len(images) == 0:
            return np.zeros(0)
        parsed = parse(sentence, self.world, self._lexicon)
        probs = self.attributes(images)
        ll = np.zeros(len(images))
        asserted = 0
        for attr, allowed in parsed.scene_constraints.items():
            if attr not in probs:
                continue
            cols = [self.values[attr].index(v) for v in allowed]
            ll += np.log(np.clip(probs[attr][:, cols].sum(axis=1), 1e-6, 1.0))
            asserted += 1
        if asserted == 0:
            ll += EMPTY_SENTENCE_LOGLIK
        return ll - UNSEEN_WORD_PENALTY * len(parsed.unrendered)

