"""Failure modes: one cause, several phrasings.

A *finding* is one caption confirmed on fresh seeds. A *failure mode* is the cause behind one or more findings: "in a
river", "underwater" and "on a boat" are three phrasings of a cat failing in water. The mode model reads what the run
measured, never the world behind the images:

- **what the failures show** (a caption's *idea*): the captions of its failed images (``caption_failures`` on its
  screen or test) share sentences that neither the class's own failures nor, on average, the other captioned
  captions' failures do (``idea_of``);
- **how they fail**: the wrong labels its failures go to, and how often they fail;
- **what the caption says**: its sentences and content words.

Two captions are phrasings of one cause (``link``) when neither fails mostly as a wrong label the other seldom fails
as, and their failures read alike (each one's most shared sentence is among the other's) at failure rates that do
not differ (phrasings of one cause fail alike: two colours the captioner names alike but that fail at 20% and 60% are
two causes), or one caption states in so many words what the other's failures show, or one holds every content word
of the other (a narrower or a wider phrasing whose failures do not say otherwise). The protocol planner asks the same
question of a candidate before it spends images on it (a phrasing of a mode waits), and the runner asks it of every
finding recorded (``ModeBook``), writing each placement as a ``mode`` event: the transcript, the view, the report,
audits and ``--json`` all read the same modes.

A mode's claim is its *best-evidenced* finding's confirmation (the smallest adjusted p, then the highest lower end
of the corrected effect): one number per mode, the same in every view, a member of the confirmation family like
any other (``best``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sleuth.tools import caption_failures
from sleuth.tools.findings import Finding
from sleuth.tools.perturb_caption import FUNCTION_WORDS
from sleuth.tools.stats import RatioCI

IDEA_SHARE = 0.5
IDEA_LIFT = 0.25
IDEA_MIN = 2
IDEA_OVER = 2.0
BACKGROUND_MIN = 4
"""A caption's idea: the sentences at least IDEA_SHARE of its captioned failures share (IDEA_MIN failures or more),
IDEA_LIFT more of them than of the class's own failures, and IDEA_OVER times their mean share over what the other
captions' failures show (once BACKGROUND_MIN others show something else; ``ideas_of``): a sentence the captioner says
of most images of the class ("it is on the road" of a bicycle) says nothing of what a caption changes, even where
the class seldom fails."""
OTHER_SHARE = 0.2
"""A wrong label under this share of a caption's failures is not one it fails as (``fails_otherwise``)."""
SPLIT_P = 0.01
"""Two captions whose failures read alike but whose failure rates differ at this two-sided level (Fisher's exact
test) are two causes (``rates_differ``): phrasings of one cause fail alike."""


def content_key(caption: str) -> frozenset[str]:
    """The caption's content words: 'a photo of a bicycle at night.' and 'a photo of a bicycle. it is at night.' are
    one hypothesis."""
    return frozenset(w for w in re.findall(r"[a-z]+", caption.lower()) if w not in FUNCTION_WORDS)


def stems(text: str) -> frozenset[str]:
    """Content words without a plural 's' ('rocks' and 'rock' are one word)."""
    return frozenset(w[:-1] if w.endswith("s") and len(w) > 3 else w for w in content_key(text))


def sentences_of(caption: str, class_prompt: str = "") -> frozenset[str]:
    """The caption's sentences beyond the class prompt's, lower case."""
    own = {s.strip().lower() for s in class_prompt.split(".") if s.strip()}
    return frozenset(s.strip().lower() for s in caption.split(".") if s.strip() and s.strip().lower() not in own)


def sentence_shares(hyps: Sequence[caption_failures.Hypothesis]) -> dict[str, float]:
    """Share of the captioned failures whose cluster caption says each sentence."""
    total = sum(h.n_images for h in hyps)
    shares: Counter[str] = Counter()
    for h in hyps:
        for s in set(h.sentences):
            shares[s.strip().lower()] += h.n_images
    return {s: c / total for s, c in shares.items()} if total else {}


@dataclass(frozen=True)
class Idea:
    """What a caption changes, read from the captions of its failures."""

    sentences: frozenset[str] = frozenset()
    """The sentences most of its failures share and the class's failures do not."""
    top: str | None = None
    """The most shared of them (one that says a word of the caption itself first)."""

    def same(self, other: Idea) -> bool:
        """One idea: each one's most shared sentence is among the other's."""
        return (self.top is not None and other.top is not None and self.top in other.sentences
                and other.top in self.sentences)


def idea_of(hyps: Sequence[caption_failures.Hypothesis], common: Mapping[str, float],
            background: Mapping[str, float] | None = None, words: frozenset[str] = frozenset()) -> Idea:
    """The sentences most of a caption's failures share and neither the class's failures nor (``background``, the
    mean share over other captions' captioned failures) the class's images in general do (none: an empty idea).
    The most shared is its top sentence, one that says a word of the caption itself (``words``, its ``stems``
    beyond the class prompt's) before any other: 'the bicycle is purple' is what 'a purple bicycle' changes,
    whatever else its failures show."""
    shares = sentence_shares(hyps)
    total = sum(h.n_images for h in hyps)
    background = background or {}
    # Among equally shared sentences, the one the captioner ranked first (it lists the likeliest first).
    rank: dict[str, float] = {}
    for h in hyps:
        for i, s in enumerate(h.sentences):
            rank[s.strip().lower()] = rank.get(s.strip().lower(), 0.0) + h.n_images / (i + 1)
    kept = sorted(((v, s) for s, v in shares.items()
                   if v >= IDEA_SHARE and v * total >= IDEA_MIN and v - common.get(s, 0.0) >= IDEA_LIFT
                   and v >= IDEA_OVER * background.get(s, 0.0)),
                  key=lambda x: (not stems(x[1]) & words, -x[0], -rank.get(x[1], 0.0), x[1]))
    return Idea(frozenset(s for _, s in kept), kept[0][1] if kept else None)


def ideas_of(captioned: Mapping[str, Sequence[caption_failures.Hypothesis]], common: Mapping[str, float],
             class_prompt: str) -> dict[str, Idea]:
    """The idea of every captioned caption, each read against what the other captions' failures show (once
    BACKGROUND_MIN others show something else): the more captions are captioned, the surer what is said of most images
    of the class.

    The other captions count by what their failures show, one vote for each top sentence (read first without a
    background): the strongest candidates are captioned first, and five phrasings of one cause among them ("in a
    river", "in a swamp", "underwater", ...) would otherwise make their own sentence look like what every image of the
    class is said to show, and none of them would have an idea."""
    base = stems(class_prompt)
    shares = {c: sentence_shares(h) for c, h in captioned.items()}
    raw = {c: idea_of(h, common, None, stems(c) - base) for c, h in captioned.items()}
    groups: dict[str, list[str]] = {}
    for c, i in raw.items():
        groups.setdefault(i.top if i.top is not None else f"\0{c}", []).append(c)
    mean: dict[str, dict[str, float]] = {}
    for key, members in groups.items():
        sums: Counter[str] = Counter()
        for c in members:
            sums.update(shares[c])
        mean[key] = {x: v / len(members) for x, v in sums.items()}
    own_group = {c: key for key, members in groups.items() for c in members}
    out = {}
    for c, hyps in captioned.items():
        others = [mean[key] for key in groups if key != own_group[c]]
        background = None
        if len(others) >= BACKGROUND_MIN:
            total: Counter[str] = Counter()
            for m in others:
                total.update(m)
            background = {x: v / len(others) for x, v in total.items()}
        out[c] = idea_of(hyps, common, background, stems(c) - base)
    return out


@dataclass(frozen=True)
class Trace:
    """What the run measured of one caption, as far as its cause goes."""

    caption: str
    labels: Counter[str] = field(default_factory=Counter, compare=False)
    """The wrong labels its failures went to."""
    idea: Idea = Idea()
    class_prompt: str = ""
    target: str | None = None
    """The wrong label it was tested for, if any (a caption of one cluster of failures names it)."""
    k: int = 0
    n: int = 0
    """Its failures in its latest measurement: a finding's confirmation, a candidate's test or pooled screen."""

    @property
    def words(self) -> frozenset[str]:
        return stems(self.caption) - stems(self.class_prompt)

    @property
    def sentences(self) -> frozenset[str]:
        return sentences_of(self.caption, self.class_prompt)

    def top_label(self) -> str | None:
        """The wrong label most of its failures (two or more) went to, if one did."""
        if self.target:
            return self.target
        most = self.labels.most_common(1)
        if not most or most[0][1] < 2 or 2 * most[0][1] <= sum(self.labels.values()):
            return None
        return most[0][0]


def rates_differ(a: Trace, b: Trace) -> bool:
    """Whether the two failure rates differ at SPLIT_P (two-sided Fisher exact test; never without both)."""
    if not a.n or not b.n:
        return False
    from scipy.stats import fisher_exact  # only once two rates are compared

    return float(fisher_exact([[a.k, a.n - a.k], [b.k, b.n - b.k]]).pvalue) < SPLIT_P


def fails_otherwise(a: Trace, b: Trace) -> bool:
    """Whether most of ``a``'s failures (two or more) go to a wrong label that few of ``b``'s failures go to (under
    OTHER_SHARE of them): a failure of its own, whatever its captions share. A caption whose failures spread over
    several wrong labels (a scene the classifier knows nothing of) claims each label it often fails as."""
    top = a.top_label()
    if top is None:
        return False
    if not b.labels:
        return b.target is not None and top != b.target
    return b.labels[top] < OTHER_SHARE * sum(b.labels.values())


STRENGTH = {"idea": 3, "states": 2, "narrower": 1, "wider": 0}
"""How surely each kind of link says two captions share a cause, surest first (a caption joins the mode it is most
surely a phrasing of)."""


@dataclass(frozen=True)
class Link:
    kind: str
    """'idea' (their failures read alike), 'states' (one caption says what the other's failures show), 'narrower' or
    'wider' (one holds every content word of the other)."""
    reason: str

    @property
    def strength(self) -> int:
        return STRENGTH[self.kind]


def link(a: Trace, b: Trace, b_name: str = "", *, symmetric: bool = True) -> Link | None:
    """Why ``a`` reads as another phrasing of ``b``'s cause, or None (the module's docstring). ``symmetric``: neither
    fails mostly as a label the other seldom fails as; otherwise only ``a`` is held to that (a candidate whose few
    screening failures cannot yet say which labels it fails as, against a finding)."""
    if fails_otherwise(a, b) or (symmetric and fails_otherwise(b, a)):
        return None
    name = b_name or repr(b.caption)
    if a.idea.same(b.idea) and not rates_differ(a, b):
        return Link("idea", f"its failures read as {name}'s: {a.idea.top!r}")
    if a.idea.top is not None and a.idea.top in b.sentences and a.idea.top in b.idea.sentences:
        return Link("states", f"{name}'s caption says what its failures show: {a.idea.top!r}")
    if b.idea.top is not None and b.idea.top in a.sentences and b.idea.top in a.idea.sentences:
        return Link("states", f"its caption says what {name}'s failures show: {b.idea.top!r}")
    # Saying part of another caption links only where the failures agree: "a black shark" says part of "... the shark
    # is black. it is in the water." without being its cause until its own failures show what that one's do.
    if a.words and a.words < b.words and a.idea.top is not None and a.idea.top in b.idea.sentences:
        return Link("narrower", f"it says part of {name}'s caption, and no more")
    if b.words and b.words <= a.words:
        return Link("wider", f"it holds every word of {name}'s caption")
    return None


@dataclass
class Mode:
    """One cause and its phrasings: findings (ids) in the order they joined, the first its founder."""

    mode_id: str
    findings: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    """Why each finding is in this mode (its founder: a cause of its own)."""
    idea: str | None = None
    """What its founder's failures show (the founder's idea, its top sentence)."""
    labels: list[str] = field(default_factory=list)
    """The wrong labels its founder fails as, most first."""


FOUNDED = "a cause of its own: no earlier finding's failures read like its"


@dataclass
class Placement:
    mode: Mode
    finding_id: str
    reason: str
    new: bool


@dataclass
class ModeBook:
    """The modes of one run, as findings are placed in them (each once, when recorded)."""

    modes: list[Mode] = field(default_factory=list)
    traces: dict[str, Trace] = field(default_factory=dict)
    """Each placed finding's trace as it read when placed."""

    def copy(self) -> ModeBook:
        return ModeBook([Mode(m.mode_id, list(m.findings), dict(m.reasons), m.idea, list(m.labels))
                         for m in self.modes], dict(self.traces))

    def mode_of(self, finding_id: str) -> Mode | None:
        return next((m for m in self.modes if finding_id in m.findings), None)

    def phrasing_of(self, trace: Trace, traces: Mapping[str, Trace] | None = None) -> tuple[Mode, str, Link] | None:
        """The mode ``trace`` is most surely another phrasing of: (mode, the member it reads like, the link). Members
        are read with ``traces`` where given (ideas read again as more captions are captioned), else as placed."""
        best: tuple[Mode, str, Link] | None = None
        for m in self.modes:
            for fid in m.findings:
                t = (traces or {}).get(fid) or self.traces.get(fid)
                got = link(trace, t, fid) if t is not None else None
                if got is not None and (best is None or got.strength > best[2].strength):
                    best = (m, fid, got)
        return best

    def place(self, finding_id: str, trace: Trace, traces: Mapping[str, Trace] | None = None) -> Placement:
        """Puts a newly recorded finding in the mode it is a phrasing of, or in a new mode of its own."""
        known = self.mode_of(finding_id)
        if known is not None:
            return Placement(known, finding_id, known.reasons[finding_id], False)
        got = self.phrasing_of(trace, traces)
        self.traces[finding_id] = trace
        if got is None:
            mode = Mode(f"m{len(self.modes) + 1}", [finding_id], {finding_id: FOUNDED}, trace.idea.top,
                        [label for label, _ in trace.labels.most_common(3)])
            self.modes.append(mode)
            return Placement(mode, finding_id, FOUNDED, True)
        mode, _, why = got
        mode.findings.append(finding_id)
        mode.reasons[finding_id] = why.reason
        # What the mode's failures show: of its findings' top sentences, the one most of their failures share (the
        # founder's first among equals): "it is in the snow" for a mode founded by a three-sentence caption.
        every = {**self.traces, **(traces or {})}
        ideas = [every[fid].idea for fid in mode.findings if fid in every]
        tops = [i.top for i in ideas if i.top]
        if tops:
            said = Counter(s for i in ideas for s in i.sentences if s in tops)
            mode.idea = max(tops, key=lambda s: (said[s], tops.count(s), s == tops[0]))
        return Placement(mode, finding_id, why.reason, False)

    def restore(self, mode_id: str, finding_id: str, reason: str, idea: str | None, labels: Sequence[str],
                trace: Trace | None = None) -> None:
        """A placement read back from the transcript (resume, fork, the view)."""
        mode = next((m for m in self.modes if m.mode_id == mode_id), None)
        if mode is None:
            mode = Mode(mode_id, [], {}, idea, list(labels))
            self.modes.append(mode)
        mode.idea = idea
        if finding_id not in mode.findings:
            mode.findings.append(finding_id)
            mode.reasons[finding_id] = reason
        if trace is not None:
            self.traces[finding_id] = trace


@dataclass(frozen=True)
class ModeClaim:
    """A mode as a reader sees it: its findings (founder first) and the one claim it makes, its best-evidenced
    finding's confirmation."""

    mode: Mode
    findings: list[Finding]
    best: Finding

    @property
    def effect(self) -> RatioCI:
        return effect_of(self.best)

    @property
    def phrasings(self) -> list[Finding]:
        """Its findings other than the best-evidenced one."""
        return [f for f in self.findings if f.finding_id != self.best.finding_id]


def claims(book: ModeBook, findings: Sequence[Finding]) -> list[ModeClaim]:
    """Each mode of ``book`` with the findings it holds (those of ``findings``), in the order the modes formed."""
    by_id = {f.finding_id: f for f in findings}
    out = []
    for m in book.modes:
        members = [by_id[fid] for fid in m.findings if fid in by_id]
        top = best(members)
        if top is not None:
            out.append(ModeClaim(m, members, top))
    return out


def best(findings: Iterable[Finding]) -> Finding | None:
    """A mode's best-evidenced finding: its confirmation's adjusted p smallest, then the highest lower end of its
    corrected effect, then the first recorded."""
    ranked = sorted(enumerate(findings), key=lambda x: (x[1].confirmation.adjusted_p, -_low(effect_of(x[1])), x[0]))
    return ranked[0][1] if ranked else None


def effect_of(f: Finding) -> RatioCI:
    """A finding's one effect: its confirmation's, corrected for selection where the confirmation gives it."""
    return f.confirmation.effect or f.confirmation.rate_ratio


def _low(r: RatioCI) -> float:
    return r.low if r.low == r.low else 0.0  # nan (no estimate) sorts last
