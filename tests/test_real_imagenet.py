"""The committed ImageNet-1k hierarchy: alignment with torchvision / open_clip, and the WordNet parent rule."""

from __future__ import annotations

import pytest

from sleuth.tools.backends.imagenet import hypernyms, imagenet_classes, imagenet_label_space

SHARE_PARENT = [("tabby cat", "tiger cat"), ("tabby cat", "Egyptian Mau"), ("Siberian Husky", "Alaskan Malamute"),
                ("lynx", "cougar"), ("Persian cat", "Siamese cat")]
DIFFERENT_PARENT = [("tabby cat", "snow leopard"), ("Persian cat", "snow leopard"), ("fly", "bee"),
                    ("crayfish", "chain-link fence"), ("goldfish", "great white shark")]


def test_thousand_unique_classes_in_sorted_wnid_order() -> None:
    classes = imagenet_classes()
    labels = imagenet_label_space().labels
    assert len(classes) == 1000 and len(set(labels)) == 1000
    wnids = [c.wnid for c in classes]
    assert wnids == sorted(wnids) and wnids[0] == "n01440764"
    assert (labels[0], labels[281], labels[282], labels[289]) == ("tench", "tabby cat", "tiger cat", "snow leopard")


def test_aligned_with_torchvision_and_open_clip() -> None:
    import open_clip
    import torchvision

    tv = torchvision.models.ResNet50_Weights.IMAGENET1K_V2.meta["categories"]
    classes = imagenet_classes()
    assert [c.torchvision_name for c in classes] == list(tv)
    same = sum(c.name == n for c, n in zip(classes, open_clip.IMAGENET_CLASSNAMES))
    assert same == 998  # the classes behind open_clip's two repeated names take torchvision's names
    assert {c.name for c in classes if c.index in (657, 744, 836, 837)} == {"missile", "projectile", "sunglass",
                                                                          "sunglasses"}


@pytest.mark.parametrize(("a", "b"), SHARE_PARENT)
def test_pairs_sharing_a_parent(a: str, b: str) -> None:
    space = imagenet_label_space()
    assert space.same_parent(a, b), (space.parent(a), space.parent(b))


@pytest.mark.parametrize(("a", "b"), DIFFERENT_PARENT)
def test_pairs_with_different_parents(a: str, b: str) -> None:
    space = imagenet_label_space()
    assert not space.same_parent(a, b), (space.parent(a), space.parent(b))


def test_parent_is_the_direct_hypernym() -> None:
    space = imagenet_label_space()
    assert space.parent("tabby cat") == "domestic cat"
    assert space.parent("snow leopard") == "big cat"
    path = hypernyms("tabby cat")
    assert path[0] == "entity" and path[-1] == "domestic cat" and "feline" in path
    assert all(space.parent(label) for label in space.labels)


def test_parent_criterion_on_top3() -> None:
    """Wiles et al.: a failure is when none of the top-3 predictions is under the true label's parent."""
    space = imagenet_label_space()

    def failed(true: str, top3: list[str]) -> bool:
        return not any(space.same_parent(true, p) for p in top3)

    assert not failed("tabby cat", ["tiger cat", "lynx", "snow leopard"])
    assert failed("Persian cat", ["snow leopard", "lynx", "cougar"])
    assert failed("fly", ["bee", "ant", "cicada"])


def test_parent_criterion_through_criteria_failed() -> None:
    """The criterion the investigation applies (tools/backends/criteria.py) on ImageNet logits."""
    import numpy as np

    from sleuth.tools.backends.criteria import failed

    space = imagenet_label_space()

    def logits_for(*top: str) -> np.ndarray:
        row = np.zeros(1000)
        for rank, label in enumerate(top):
            row[space.index(label)] = 10.0 - rank
        return row

    rows = np.stack([logits_for("tiger cat", "lynx", "snow leopard"),  # a domestic cat at rank 1
                     logits_for("snow leopard", "lynx", "Egyptian Mau"),  # ... at rank 3
                     logits_for("snow leopard", "lynx", "cougar", "tabby cat"),  # ... only at rank 4
                     logits_for("tabby cat")])
    assert failed(rows, "tabby cat", space, "parent", k=3).tolist() == [False, False, True, False]
    assert failed(rows, "tabby cat", space, "top1").tolist() == [True, True, True, False]
    assert failed(rows, "tabby cat", space, "topk", k=3).tolist() == [True, True, True, False]
    # A class alone under its parent: the parent criterion is the top-k criterion.
    lonely = next(label for label in space.labels
                  if sum(space.parent(x) == space.parent(label) for x in space.labels) == 1)
    solo = np.stack([logits_for(lonely), logits_for("tabby cat", "tiger cat", "lynx")])
    assert failed(solo, lonely, space, "parent").tolist() == failed(solo, lonely, space, "topk").tolist() \
        == [False, True]
