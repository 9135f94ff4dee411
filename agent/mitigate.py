"""`sleuth mitigate`: retrain a classifier's final layer on generated images of its confirmed failures, and show on
fresh seeds whether that fixed them without breaking the rest.

Following Chegini & Feizi's recipe for failure modes found with generated data:

1. **Data.** For each selected finding, ``n`` images of its caption (the failure mode, labelled with the class
   under audit), kept when the generator calls them valid and, with the captioner filter, when the captioner reads
   the caption's own sentences in them more readily than in plain images of the class; and ``id_n`` images of every
   class's own prompt (in-distribution). All on seeds of their own, disjoint from every investigation's.
2. **Training.** The final linear layer alone (features frozen, computed once), on
   ``(1 - lambda) * loss(in-distribution) + lambda * loss(failure modes)``.
3. **Evaluation, on fresh seeds never used for training.** The same images go through the classifier before and
   after, so every comparison is paired: each finding's failure rate (the mitigated ones, and every other finding of
   the runs: did fixing one break another?), each audited class's baseline, and top-1 accuracy over all classes.
   A finding's improvement is the exact one-sided McNemar test, Holm-adjusted over the mitigated findings; harm to
   any other measurement is tested the same way the other way round. Accuracy must be non-inferior: the one-sided
   lower bound of (after - before), Newcombe's paired interval, above ``-margin``.
4. **Verdict.** A finding is *mitigated* only when its improvement is significant and accuracy is non-inferior;
   the weights are written either way, with the spec that loads them (``--classifier`` of any command).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from sleuth.agent.errors import UsageError
from sleuth.agent.events import Finding as FindingEvent
from sleuth.agent.events import RunFinished, RunStarted, ToolCalled, ToolReturned
from sleuth.agent.transcript import TranscriptError, TranscriptWriter, read_transcript
from sleuth.tools import stats
from sleuth.tools.backends.base import BackendError, Backends
from sleuth.tools.backends.criteria import failed
from sleuth.tools.backends.specs import BackendSpecs, parse_spec
from sleuth.tools.findings import Finding
from sleuth.tools.investigation import normalise_caption, split_sentences

Progress = Callable[[str, int, int], None]

TRAIN_OFFSET = 1 << 48
"""Seeds of mitigation training data: above every investigation's discovery [0, 2^40) and confirmation
[2^40, 2^41) seeds."""
EVAL_OFFSET = 2 << 48
"""Seeds of mitigation evaluations, disjoint from the training seeds."""
SEEDS_PER_MITIGATION = 1 << 32
"""Each mitigation seed (0..65535) owns this many seeds of each kind: 2^48 in all, below the next offset."""
SLOT = 1 << 20
"""Seeds of one finding's or one class's images within a mitigation's block (at most this many images each)."""
MAX_SLOTS = SEEDS_PER_MITIGATION // SLOT
MAX_IMAGES = SLOT


class MitigateConfig(BaseModel):
    """What `sleuth mitigate` does; every setting has a default."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    findings: list[str] | None = Field(None, description="Findings to mitigate (FINDING or CLASS:FINDING); "
                                                         "None: every confirmed finding of the runs.")
    n: int = Field(2000, ge=1, le=MAX_IMAGES, description="Generated images per finding (before the filter).")
    lam: float = Field(0.5, alias="lambda", ge=0.0, le=1.0,
                       description="Weight of the failure-mode loss; 1 - lambda goes to in-distribution images.")
    id_n: int = Field(500, ge=1, le=MAX_IMAGES, description="In-distribution training images per class.")
    eval_n: int = Field(1000, ge=1, le=MAX_IMAGES, description="Fresh evaluation images per finding and class.")
    eval_id_n: int = Field(500, ge=1, le=MAX_IMAGES,
                           description="Fresh evaluation images per class for in-distribution accuracy.")
    margin: float = Field(0.01, gt=0.0, lt=1.0, description="Non-inferiority margin of accuracy (0.01: 1 point).")
    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    filter: Literal["captioner", "none"] = Field("captioner", description="Keep generated images the captioner "
                                                                          "reads the failure mode in.")
    train: Literal["auto", "head", "block"] = Field(
        "auto", description="What is retrained: the final linear layer (head), also the last convolutional block "
                            "(block; the toyworld CNN), or auto: block where supported, else head.")
    steps: int = Field(1200, ge=1, le=100_000,
                       description="Training steps (each a minibatch of 2,048 of each group).")
    lr: float = Field(3e-3, gt=0.0)
    seed: int = Field(0, ge=0, le=65535, description="Selects the mitigation's blocks of seeds.")


# -- results -----------------------------------------------------------------------------------------------------


class PairedRates(BaseModel):
    """A failure rate before and after on the same images, with the paired tests both ways."""

    caption: str
    label: str
    before: stats.Rate
    after: stats.Rate
    ratio: stats.RatioCI = Field(description="after / before, matched-pairs interval.")
    fixed: int = Field(description="Images that failed before and not after.")
    broken: int = Field(description="Images that failed after and not before.")
    p_better: float = Field(description="Exact one-sided McNemar p that the rate went down.")
    p_worse: float = Field(description="Exact one-sided McNemar p that the rate went up.")
    adjusted_p_better: float | None = None
    adjusted_p_worse: float | None = None


class FindingOutcome(BaseModel):
    run: str
    finding_id: str
    label: str
    caption: str
    mitigated_here: bool = Field(description="Its images were in the training data.")
    training_images: int = 0
    generated: int = 0
    filter_pass_rate: float | None = None
    unrendered: list[str] = Field(default_factory=list)
    rates: PairedRates
    verdict: Literal["mitigated", "not shown", "worse", "unchanged"]


class Accuracy(BaseModel):
    n_per_class: int
    classes: int
    test: stats.NonInferiority
    per_class: dict[str, tuple[float, float]] = Field(description="Class -> (accuracy before, after).")


class MitigationResult(BaseModel):
    config: dict[str, Any]
    runs: list[str]
    backends: dict[str, Any]
    classifier_before: str
    classifier_after: str = Field(description="The spec that loads the mitigated classifier.")
    trained: str = Field(description="What was retrained: head, or block (the last block and the head).")
    weights: str
    reload_max_abs_diff: float = Field(description="Largest logit difference between the saved classifier, loaded "
                                                   "again through its spec, and the head that was trained.")
    findings: list[FindingOutcome]
    baselines: list[PairedRates]
    accuracy: Accuracy
    effective: bool = Field(description="Every mitigated finding improved significantly and accuracy is "
                                        "non-inferior.")
    seconds: float
    images: dict[str, int]


# -- inputs --------------------------------------------------------------------------------------------------------


@dataclass
class RunFindings:
    path: Path
    started: RunStarted
    label: str
    criterion: str
    backends: BackendSpecs
    findings: list[Finding]


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Transcripts of the run directories given, or of the runs of the audits given."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            out.append(p)
        elif (p / "transcript.jsonl").is_file():
            out.append(p / "transcript.jsonl")
        elif p.is_dir():
            found = sorted({*p.glob("*/transcript.jsonl"), *p.glob("*/*/transcript.jsonl")})
            if not found:
                raise UsageError(f"no transcript.jsonl in {p} or the run directories below it")
            out += found
        else:
            raise UsageError(f"no such run directory: {p}")
    return list(dict.fromkeys(out))


def load_run(transcript: Path) -> RunFindings:
    from sleuth.agent.replay.rebuild import recorded_config

    try:
        events = read_transcript(transcript)
    except TranscriptError as e:
        raise UsageError(f"{transcript}: line {e.line}: {e.reason}") from None
    if not events or not isinstance(events[0], RunStarted):
        raise UsageError(f"{transcript}: not an investigation transcript")
    started = events[0]
    try:
        config = recorded_config(started)
    except Exception as e:  # a RebuildError names the problem
        raise UsageError(f"{transcript}: {e}") from None
    # Each finding as its latest event has it (a counterfactual may be added to it after it was recorded).
    latest = {e.finding_id: e.finding for e in events if isinstance(e, FindingEvent)}
    findings = [Finding.model_validate(f) for f in latest.values()]
    return RunFindings(transcript.parent, started, config.label, config.criterion, config.backends,
                       [f for f in findings if f.confirmed])


def select(runs: Sequence[RunFindings], wanted: Sequence[str] | None) -> set[tuple[int, str]]:
    """(run index, finding id) of the findings to mitigate."""
    every = {(i, f.finding_id) for i, r in enumerate(runs) for f in r.findings}
    if wanted is None:
        return every
    chosen: set[tuple[int, str]] = set()
    for w in wanted:
        label, _, fid = w.rpartition(":")
        hits = [(i, f.finding_id) for i, r in enumerate(runs) for f in r.findings
                if f.finding_id == fid and (not label or label in (r.label, r.label.replace(" ", "_")))]
        if not hits:
            known = ", ".join(f"{r.label}:{f.finding_id}" for r in runs for f in r.findings) or "none"
            raise UsageError(f"no confirmed finding {w!r} in the runs (known: {known}).")
        if len(hits) > 1:
            raise UsageError(f"finding {w!r} is in several runs: name it as CLASS:{fid} "
                             f"({', '.join(runs[i].label for i, _ in hits)}).")
        chosen |= set(hits)
    return chosen


# -- the work ------------------------------------------------------------------------------------------------------


def _seeds(offset: int, config: MitigateConfig, slot: int, n: int) -> list[int]:
    if not 0 <= slot < MAX_SLOTS:
        raise UsageError(f"too many classes and findings for one mitigation (at most {MAX_SLOTS} in all)")
    start = offset + config.seed * SEEDS_PER_MITIGATION + slot * SLOT
    return list(range(start, start + n))


def mode_sentences(caption: str, class_prompt: str) -> list[str]:
    """The sentences of a finding's caption that are not the class prompt (the failure mode); the whole caption when
    it rewrites the class prompt itself (a domain: "an oil painting of a bicycle.")."""
    base = normalise_caption(class_prompt)
    rest = [s for s in split_sentences(caption) if normalise_caption(s) != base]
    return rest if len(rest) < len(split_sentences(caption)) else [caption]


def paired_rates(caption: str, label: str, before: np.ndarray, after: np.ndarray) -> PairedRates:
    """``before`` and ``after``: which of the same images fail."""
    n = len(before)
    both = int((before & after).sum())
    fixed = int((before & ~after).sum())
    broken = int((~before & after).sum())
    return PairedRates(caption=caption, label=label, before=stats.binomial_rate(int(before.sum()), n),
                       after=stats.binomial_rate(int(after.sum()), n),
                       ratio=stats.paired_rate_ratio(both, broken, fixed, n),
                       fixed=fixed, broken=broken, p_better=stats.mcnemar_exact(fixed, broken, "greater").p_value,
                       p_worse=stats.mcnemar_exact(broken, fixed, "greater").p_value)


class Mitigation:
    """One mitigation: the runs, the backends they share, and the classifier's head."""

    def __init__(self, runs: Sequence[RunFindings], config: MitigateConfig, *, device: str = "cpu",
                 progress: Progress | None = None) -> None:
        if not runs:
            raise UsageError("no runs to mitigate")
        first = runs[0].backends.model_dump()
        for r in runs[1:]:
            if r.backends.model_dump() != first:
                raise UsageError(f"the runs used different models: {runs[0].path} and {r.path}; mitigate the runs "
                                 "of one classifier at a time.")
        self.runs = list(runs)
        self.config = config
        self.specs = runs[0].backends
        self.progress = progress
        self.device = device
        self.chosen = select(runs, config.findings)
        if not self.chosen:
            raise UsageError("the runs recorded no confirmed finding to mitigate.")

    def _tick(self, task: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(task, done, total)

    def run(self, out: Path) -> MitigationResult:
        from sleuth.tools.backends.heads import Group, LinearHead, fit, reload, tail_logits

        t0 = time.perf_counter()
        cfg = self.config
        try:
            backends: Backends = self.specs.build(self.progress, load=True)
            spec = parse_spec(self.specs.classifier, "classifier")
            impl = reload(self.specs.classifier, device=self.device, world=self.specs.world) \
                if spec.kind == "toyworld" else None
            if impl is None:
                from sleuth.tools.backends.specs import make_classifier

                impl = make_classifier(self.specs.classifier, device=self.specs.device, dtype=self.specs.dtype)
            train = ("block" if spec.kind == "toyworld" else "head") if cfg.train == "auto" else cfg.train
            head = LinearHead(impl, spec, train=train)
        except BackendError as e:
            raise UsageError(str(e)) from None
        if impl.id != backends.classifier.id:
            raise UsageError(f"the classifier loads as {impl.id}, but the investigation used "
                             f"{backends.classifier.id}")
        recorded = self.runs[0].started.backends.get("classifier")
        if recorded and recorded != impl.id:
            raise UsageError(f"the runs used classifier {recorded!r}; these settings load {impl.id!r}, so the "
                             "findings may not hold for it.")
        labels = impl.labels.labels
        gen = backends.generator
        counts = {"training": 0, "evaluation": 0}

        def images(prompt: str, seeds: list[int]) -> tuple[list[np.ndarray], list[bool]]:
            out_i: list[np.ndarray] = []
            valid: list[bool] = []
            for start in range(0, len(seeds), 500):
                for g in gen.generate([prompt] * len(seeds[start:start + 500]), seeds[start:start + 500]):
                    out_i.append(g.image)
                    valid.append(bool(g.valid))
            return out_i, valid

        # 1. in-distribution training data: every class's own prompt
        id_feats: list[torch.Tensor] = []
        id_labels: list[int] = []
        class_images: dict[str, list[np.ndarray]] = {}
        for j, label in enumerate(labels):
            ims, valid = images(backends.prompt_for(label), _seeds(TRAIN_OFFSET, cfg, j, cfg.id_n))
            ims = [im for im, ok in zip(ims, valid) if ok]
            class_images[label] = ims
            id_feats.append(head.features(ims))
            id_labels += [j] * len(ims)
            counts["training"] += cfg.id_n
            self._tick("in-distribution images", j + 1, len(labels))
        groups = [Group(torch.cat(id_feats), torch.tensor(id_labels, dtype=torch.long), 1.0 - cfg.lam)]

        # 2. failure-mode training data: each chosen finding's caption, filtered
        entries = [(i, r, f) for i, r in enumerate(self.runs) for f in r.findings]
        chosen = [(i, r, f) for i, r, f in entries if (i, f.finding_id) in self.chosen]
        data: dict[tuple[int, str], dict[str, Any]] = {}
        mode_feats: list[torch.Tensor] = []
        mode_labels: list[int] = []
        for slot, (i, r, f) in enumerate(chosen):
            prompt = backends.prompt_for(r.label)
            ims, valid = images(f.caption, _seeds(TRAIN_OFFSET, cfg, len(labels) + slot, cfg.n))
            counts["training"] += cfg.n
            keep = np.asarray(valid, dtype=bool)
            rate: float | None = None
            if cfg.filter == "captioner" and keep.any():
                sentences = mode_sentences(f.caption, prompt)
                score = sum(np.asarray(backends.captioner.sentence_loglik(ims, s, prompt), float) for s in sentences)
                reference = sum(np.asarray(backends.captioner.sentence_loglik(class_images[r.label], s, prompt),
                                           float) for s in sentences)
                keep &= np.asarray(score) > float(np.median(reference))
                rate = float(keep.sum() / max(1, np.asarray(valid).sum()))
            kept = [im for im, k in zip(ims, keep) if k]
            data[(i, f.finding_id)] = {"generated": len(ims), "kept": len(kept), "pass_rate": rate,
                                       "unrendered": list(gen.unrendered([f.caption])[0])}
            if kept:
                mode_feats.append(head.features(kept))
                mode_labels += [labels.index(r.label)] * len(kept)
            self._tick("failure-mode images", slot + 1, len(chosen))
        if not mode_labels:
            raise UsageError("no generated image of the findings passed the filter; try --filter none.")
        groups.append(Group(torch.cat(mode_feats), torch.tensor(mode_labels, dtype=torch.long), cfg.lam))

        # 3. the head
        original = head.tail()
        torch.manual_seed(cfg.seed)
        new = fit(head.tail(), groups, steps=cfg.steps, lr=cfg.lr, seed=cfg.seed, progress=self.progress)

        # 4. evaluation on fresh seeds: the same images before (the original head) and after (the new one)
        def fresh(prompt: str, slot: int, n: int) -> tuple[torch.Tensor, list[np.ndarray]]:
            ims, valid = images(prompt, _seeds(EVAL_OFFSET, cfg, slot, n))
            ims = [im for im, ok in zip(ims, valid) if ok]
            counts["evaluation"] += n
            return head.features(ims), ims

        def judge(prompt: str, label: str, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
            x, _ = fresh(prompt, slot, n)
            criterion = self.runs[0].criterion
            return (failed(tail_logits(original, x), label, impl.labels, criterion),
                    failed(tail_logits(new, x), label, impl.labels, criterion))

        outcomes: list[FindingOutcome] = []
        for slot, (i, r, f) in enumerate(entries):
            b, a = judge(f.caption, r.label, slot, cfg.eval_n)
            d = data.get((i, f.finding_id), {})
            outcomes.append(FindingOutcome(
                run=str(r.path), finding_id=f.finding_id, label=r.label, caption=f.caption,
                mitigated_here=(i, f.finding_id) in self.chosen, training_images=int(d.get("kept", 0)),
                generated=int(d.get("generated", 0)), filter_pass_rate=d.get("pass_rate"),
                unrendered=list(d.get("unrendered", [])), rates=paired_rates(f.caption, r.label, b, a),
                verdict="unchanged"))
            self._tick("evaluating findings", slot + 1, len(entries))
        audited = list(dict.fromkeys(r.label for r in self.runs))
        baselines = []
        offset = len(entries)
        for j, label in enumerate(audited):
            b, a = judge(backends.prompt_for(label), label, offset + j, cfg.eval_n)
            baselines.append(paired_rates(backends.prompt_for(label), label, b, a))
        # accuracy over every class, top-1, on its own prompt
        offset += len(audited)
        ok_before: list[np.ndarray] = []
        ok_after: list[np.ndarray] = []
        per_class: dict[str, tuple[float, float]] = {}
        sample: tuple[torch.Tensor, list[np.ndarray]] | None = None
        for j, label in enumerate(labels):
            x, ims = fresh(backends.prompt_for(label), offset + j, cfg.eval_id_n)
            b = np.argmax(tail_logits(original, x), axis=1) != j
            a = np.argmax(tail_logits(new, x), axis=1) != j
            ok_before.append(~b)
            ok_after.append(~a)
            per_class[label] = (float((~b).mean()), float((~a).mean()))
            if sample is None and len(ims):
                sample = (x[:16], ims[:16])
            self._tick("evaluating accuracy", j + 1, len(labels))
        ob, oa = np.concatenate(ok_before), np.concatenate(ok_after)
        accuracy = Accuracy(n_per_class=cfg.eval_id_n, classes=len(labels), per_class=per_class,
                            test=stats.non_inferiority(int((ob & oa).sum()), int((ob & ~oa).sum()),
                                                       int((~ob & oa).sum()), len(ob), cfg.margin, cfg.alpha))

        # 5. families: improvement of the mitigated findings (Holm), harm to every measurement (Holm)
        mine = [o for o in outcomes if o.mitigated_here]
        for o, p in zip(mine, stats.adjust_pvalues([o.rates.p_better for o in mine], "holm")):
            o.rates.adjusted_p_better = p
        watched = [o.rates for o in outcomes] + baselines
        for r_, p in zip(watched, stats.adjust_pvalues([r_.p_worse for r_ in watched], "holm")):
            r_.adjusted_p_worse = p
        for o in outcomes:
            worse = (o.rates.adjusted_p_worse or 1.0) < cfg.alpha
            better = o.mitigated_here and (o.rates.adjusted_p_better or 1.0) < cfg.alpha
            o.verdict = "worse" if worse else ("mitigated" if better and accuracy.test.shown else
                                               "not shown" if o.mitigated_here else "unchanged")

        # 6. the weights, and a check that they load back to the head that was trained
        try:
            saved = head.save(new, out, note=f"sleuth mitigate, lambda={cfg.lam}")
            again = reload(saved, device=self.device, world=self.specs.world)
        except BackendError as e:
            raise UsageError(f"the mitigated classifier was written but does not load again: {e}") from None
        diff = 0.0
        if sample is not None:
            diff = float(np.max(np.abs(np.asarray(again.logits(sample[1])) - tail_logits(new, sample[0]))))
        return MitigationResult(
            config=cfg.model_dump(mode="json", by_alias=True), runs=[str(r.path) for r in self.runs],
            backends=self.specs.model_dump(mode="json", exclude_none=True), classifier_before=impl.id,
            classifier_after=saved, trained=head.train, weights=saved.split(":", 1)[1] if saved.startswith("hf:") else
            saved.rsplit(":", 1)[1], reload_max_abs_diff=diff, findings=outcomes, baselines=baselines,
            accuracy=accuracy, effective=bool(mine) and all(o.verdict == "mitigated" for o in mine),
            seconds=time.perf_counter() - t0, images=counts)


# -- transcript and text ---------------------------------------------------------------------------------------


def summary_lines(result: MitigationResult) -> list[str]:
    acc = result.accuracy.test
    ci = acc.interval
    lines = []
    for o in result.findings:
        r = o.rates
        tag = "mitigated" if o.mitigated_here else "other"
        lines.append(f"{o.label}:{o.finding_id} ({tag}) {o.caption!r}: {r.before.k}/{r.before.n} -> "
                     f"{r.after.k}/{r.after.n}, {o.verdict}")
    lines.append(f"accuracy over {result.accuracy.classes} classes: {ci.before.rate:.2%} -> {ci.after.rate:.2%} "
                 f"(difference {ci.difference:+.2%}, one-sided {1 - acc.alpha:.0%} bound {ci.low:+.2%}; "
                 f"non-inferiority at -{acc.margin:.1%} {'shown' if acc.shown else 'not shown'})")
    lines.append(f"weights: {result.classifier_after}")
    return lines


def write(result: MitigationResult, out: Path, command: str) -> Path:
    """``out/mitigation.json`` and a hash-chained transcript ``out/mitigation.jsonl`` (run_started, one
    tool_called / tool_returned pair per stage, run_finished)."""
    from sleuth.agent.session import versions

    out.mkdir(parents=True, exist_ok=True)
    path = out / "mitigation.json"
    tmp = path.with_name(".mitigation.json.tmp")
    tmp.write_text(result.model_dump_json(indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    log = out / "mitigation.jsonl"
    if log.exists():
        log.unlink()
    with TranscriptWriter(log) as w:
        w.append(RunStarted(run_id=out.name, command=command, config=result.config, versions=versions(),
                            seeds={"mitigation_seed": result.config["seed"], "train_offset": TRAIN_OFFSET,
                                   "eval_offset": EVAL_OFFSET},
                            planner="mitigate", backends={"classifier": result.classifier_before}))
        data = [o.model_dump(mode="json", include={"run", "finding_id", "label", "caption", "generated",
                                                   "training_images", "filter_pass_rate", "unrendered"})
                for o in result.findings if o.mitigated_here]
        stages: list[tuple[str, dict[str, Any]]] = [
                  ("mitigation_data", {"findings": data, "images": result.images}),
                  ("fine_tune", {"classifier_before": result.classifier_before,
                                 "classifier_after": result.classifier_after, "trained": result.trained,
                                 "reload_max_abs_diff": result.reload_max_abs_diff}),
                  ("evaluate", result.model_dump(mode="json", include={"findings", "baselines", "accuracy",
                                                                        "effective"}))]
        for k, (name, body) in enumerate(stages):
            w.append(ToolCalled(call_id=f"m{k + 1}", name=name, arguments={}))
            w.append(ToolReturned(call_id=f"m{k + 1}", name=name, ok=True, result=body))
        w.append(RunFinished(status="completed", answer="\n".join(summary_lines(result)),
                             n_findings=sum(o.verdict == "mitigated" for o in result.findings)))
    return path


def pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1%}"
