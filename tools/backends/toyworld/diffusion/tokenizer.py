"""A CLIP BPE tokenizer for a world's texts, learned offline: every word of the training texts is one token.

The vocabulary has CLIP's layout (the 256 byte symbols, the same with the end-of-word mark ``</w>``, the merges,
then ``<|startoftext|>`` and ``<|endoftext|>``), so transformers' ``CLIPTokenizer`` loads and applies it like any
CLIP tokenizer. A word never seen in training falls back to smaller pieces, down to single letters.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import regex

PATTERN = regex.compile(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|"""
                        r"""[^\s\p{L}\p{N}]+""", regex.IGNORECASE)
BOS, EOS = "<|startoftext|>", "<|endoftext|>"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table, which CLIP's BPE works on."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def words(texts: Iterable[str]) -> Counter[str]:
    table = bytes_to_unicode()
    counts: Counter[str] = Counter()
    for text in texts:
        for w in PATTERN.findall(" ".join(text.lower().split())):
            counts["".join(table[b] for b in w.encode("utf-8"))] += 1
    return counts


def learn_bpe(texts: Iterable[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) of a BPE that spells every word of ``texts`` as one token; deterministic (ties by symbol)."""
    counts = words(texts)
    spelled = {w: [*w[:-1], w[-1] + "</w>"] for w in counts}
    merges: list[tuple[str, str]] = []
    while True:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, symbols in spelled.items():
            for a, b in zip(symbols, symbols[1:]):
                pairs[(a, b)] += counts[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        for w, symbols in spelled.items():
            i, out = 0, []
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            spelled[w] = out
    base = list(bytes_to_unicode().values())
    symbols = base + [s + "</w>" for s in base] + [a + b for a, b in merges] + [BOS, EOS]
    vocab: dict[str, int] = {}
    for s in symbols:
        vocab.setdefault(s, len(vocab))
    return vocab, merges


def build_tokenizer(texts: Iterable[str], max_length: int) -> object:
    """A ``CLIPTokenizer`` learned on ``texts`` (save it with ``save_pretrained``)."""
    from transformers import CLIPTokenizer

    vocab, merges = learn_bpe(texts)
    # transformers types merges as strings; its BPE takes the (left, right) pairs it stores.
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_length)  # type: ignore[arg-type]
