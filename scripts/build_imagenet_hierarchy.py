"""Derive tools/backends/data/imagenet_hierarchy.json from WordNet 3.0 (run once; the JSON is committed).

For each of the 1000 ImageNet-1k classes, in the standard sorted-wnid order that torchvision and timm use:
its wnid, a unique display name, torchvision's category name, and its WordNet hypernym path (root first).

WordNet comes from Debian's packages, read with nltk (needed only here):

    apt-get update && apt-get install -y wordnet-base wordnet-sense-index
    python3 -m venv /tmp/nltk-venv && /tmp/nltk-venv/bin/pip install nltk
    PYTHONPATH=/tmp/nltk-venv/lib/python3.11/site-packages \\
        .venv/bin/python scripts/build_imagenet_hierarchy.py

Class names: open_clip's IMAGENET_CLASSNAMES (readable, e.g. "tabby cat"); the two names it repeats
("missile", "sunglasses") take torchvision's category names instead. The wnid list comes from timm's
imagenet_synsets.txt; index alignment is checked against the WordNet lemmas of each synset.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tools" / "backends" / "data" / "imagenet_hierarchy.json"
WORDNET_DIR = Path("/usr/share/wordnet")

# nltk needs the lexicographer file list, which Debian's packages do not ship (WordNet 3.0 lexnames).
LEXNAMES = [
    ("adj.all", 3), ("adj.pert", 3), ("adv.all", 4), ("noun.Tops", 1), ("noun.act", 1), ("noun.animal", 1),
    ("noun.artifact", 1), ("noun.attribute", 1), ("noun.body", 1), ("noun.cognition", 1),
    ("noun.communication", 1), ("noun.event", 1), ("noun.feeling", 1), ("noun.food", 1), ("noun.group", 1),
    ("noun.location", 1), ("noun.motive", 1), ("noun.object", 1), ("noun.person", 1), ("noun.phenomenon", 1),
    ("noun.plant", 1), ("noun.possession", 1), ("noun.process", 1), ("noun.quantity", 1), ("noun.relation", 1),
    ("noun.shape", 1), ("noun.state", 1), ("noun.substance", 1), ("noun.time", 1), ("verb.body", 2),
    ("verb.change", 2), ("verb.cognition", 2), ("verb.communication", 2), ("verb.competition", 2),
    ("verb.consumption", 2), ("verb.contact", 2), ("verb.creation", 2), ("verb.emotion", 2), ("verb.motion", 2),
    ("verb.perception", 2), ("verb.possession", 2), ("verb.social", 2), ("verb.stative", 2), ("verb.weather", 2),
    ("adj.ppl", 3),
]


def prepare_nltk_data(wordnet_dir: Path) -> Path:
    data = Path(tempfile.mkdtemp(prefix="nltk_data_"))
    corpus = data / "corpora" / "wordnet"
    corpus.mkdir(parents=True)
    for f in wordnet_dir.iterdir():
        if f.is_file():
            shutil.copy(f, corpus / f.name)
    (corpus / "lexnames").write_text("".join(f"{i:02d}\t{n}\t{c}\n" for i, (n, c) in enumerate(LEXNAMES)))
    return data


def wnid(synset) -> str:
    return f"{synset.pos()}{synset.offset():08d}"


def canonical_path(synset) -> list:
    """Root-first hypernym path. With several hypernyms, follow the one deepest in the tree (the most
    specific), ties broken by synset name, so the path is stable across nltk versions."""
    path = [synset]
    s = synset
    while True:
        ups = s.hypernyms() + s.instance_hypernyms()
        if not ups:
            break
        s = sorted(ups, key=lambda u: (-u.max_depth(), u.name()))[0]
        path.append(s)
    return path[::-1]


def readable(synset) -> str:
    return synset.lemmas()[0].name().replace("_", " ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wordnet", type=Path, default=WORDNET_DIR, help="WordNet 3.0 dict folder.")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    os.environ["NLTK_DATA"] = str(prepare_nltk_data(args.wordnet))
    import open_clip
    import timm
    import torchvision
    from nltk.corpus import wordnet as wn

    assert wn.get_version() == "3.0", wn.get_version()
    info = Path(timm.__file__).parent / "data" / "_info"
    wnids = (info / "imagenet_synsets.txt").read_text().split()
    assert len(wnids) == 1000 and wnids == sorted(wnids)
    clip_names = list(open_clip.IMAGENET_CLASSNAMES)
    tv_names = list(torchvision.models.ResNet50_Weights.IMAGENET1K_V2.meta["categories"])
    counts = collections.Counter(clip_names)
    names = [tv if counts[c] > 1 else c for c, tv in zip(clip_names, tv_names)]
    assert len(set(names)) == 1000, "class names must be unique"

    synsets = [wn.synset_from_pos_and_offset("n", int(w[1:])) for w in wnids]
    # Index alignment check: torchvision's name should be one of the synset's lemmas for nearly all classes.
    hits = sum(tv.lower().replace(" ", "_") in {lem.name().lower() for lem in s.lemmas()}
               for tv, s in zip(tv_names, synsets))
    assert hits >= 950, f"only {hits}/1000 torchvision names match their synset's lemmas: misaligned?"

    ancestor_names: dict[str, str] = {}
    classes = []
    for i, (w, s) in enumerate(zip(wnids, synsets)):
        path = canonical_path(s)
        assert wnid(path[-1]) == w
        for a in path[:-1]:
            ancestor_names[wnid(a)] = readable(a)
        classes.append({"index": i, "wnid": w, "name": names[i], "torchvision_name": tv_names[i],
                        "path": [wnid(a) for a in path]})
    doc = {
        "source": "WordNet 3.0 (Debian wordnet-base), ImageNet-1k classes in sorted-wnid order; "
                  "built by scripts/build_imagenet_hierarchy.py",
        "parent_rule": "parent = direct WordNet hypernym (path[-2]); with several hypernyms the deepest one",
        "synsets": dict(sorted(ancestor_names.items())),
        "classes": classes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # One class per line: small diffs, still valid JSON.
    lines = ",\n".join("  " + json.dumps(c) for c in classes)
    head = json.dumps({k: v for k, v in doc.items() if k != "classes"}, indent=1)[:-2]
    args.out.write_text(f"{head},\n\"classes\": [\n{lines}\n]}}\n")
    json.loads(args.out.read_text())
    print(f"wrote {args.out}: {len(classes)} classes, {len(ancestor_names)} ancestor synsets, "
          f"{hits}/1000 torchvision names matched lemmas")


if __name__ == "__main__":
    main()
