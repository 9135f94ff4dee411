"""The investigation tools on a backend set with known rates (tests/fakeworld.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sleuth.tools import investigation_tools as registry
from sleuth.tools import record_finding, stats
from sleuth.tools.artifacts import ArtifactStore
from sleuth.tools.context import ToolContext
from sleuth.tools.investigation import CONFIRMATION_OFFSET, Budget, Investigation
from sleuth.tools.registry import ToolError
from tests.fakeworld import RATES, fake_backends

CAT = "a realistic photograph of a cat"
SNOW = "a realistic photograph of a cat. it is in the snow."
GRASS = "a realistic photograph of a cat. it is in the grass."


@pytest.fixture()
def ctx(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    inv = Investigation(backends=fake_backends(), label="cat", artifacts=store, budget=Budget(images=50_000))
    emitted: list = []
    c = ToolContext(investigation=inv, artifacts=store, on_finding=emitted.append)
    c.emitted = emitted  # type: ignore[attr-defined]
    return c


def call(ctx, name, **args):
    return registry().call(name, args, ctx)


def test_generate_and_classify_counts_failures_with_interval(ctx):
    r = call(ctx, "generate_and_classify", prompt=CAT + " in the snow", n=400, target_label="snow leopard")
    f = r.summary.failures
    assert f.n == 400
    # True rate 0.6 (seeds 0..399 draw 214 failures: 2.7 SE low). The interval is the Wilson interval of k/n,
    # and the count is plausible within 4 SE.
    expected = stats.binomial_rate(f.k, f.n)
    assert (f.low, f.high) == pytest.approx((expected.low, expected.high))
    assert f.low < f.rate < f.high
    assert abs(f.k - 400 * RATES["snow"]) < 4 * np.sqrt(400 * 0.6 * 0.4)
    assert r.summary.target_hits == f.k  # every failure is a snow leopard in this world
    assert r.summary.confusions[0].label == "snow leopard"
    assert len(r.failure_images) == 8 and len(r.success_images) == 4
    assert ctx.investigation.artifacts.exists(r.failure_images[0])


def test_unrendered_words_are_reported(ctx):
    r = call(ctx, "generate_and_classify", prompt=CAT + " with purple stripes", n=10)
    assert r.summary.unrendered == ["purple", "stripes"]


def test_bad_arguments_are_readable_errors(ctx):
    with pytest.raises(ToolError, match="n"):
        call(ctx, "generate_and_classify", prompt=CAT, n=0)
    with pytest.raises(ToolError, match="snow leopard"):
        call(ctx, "generate_and_classify", prompt=CAT, n=5, target_label="snow leoprd")


def test_seeds_are_never_reused_between_discovery_and_confirmation(ctx):
    inv = ctx.investigation
    d1 = inv.allocate_seeds(100)
    d2 = inv.allocate_seeds(50)
    c1 = inv.allocate_seeds(100, "confirmation")
    assert set(d1).isdisjoint(d2)
    assert min(c1) >= CONFIRMATION_OFFSET > max(d1 + d2)


def test_budget_is_enforced(tmp_path):
    inv = Investigation(backends=fake_backends(), label="cat", budget=Budget(images=100))
    c = ToolContext(investigation=inv)
    call(c, "generate_and_classify", prompt=CAT, n=80)
    with pytest.raises(ToolError, match="budget"):
        call(c, "generate_and_classify", prompt=CAT, n=80)


def test_caption_failures_names_the_failing_background(ctx):
    base = call(ctx, "generate_and_classify", prompt=CAT, n=1000)
    caps = call(ctx, "caption_failures", measurement_id=base.measurement_id)
    assert caps.n_failures == base.summary.failures.k
    top = caps.hypotheses[0]
    # Snow images are 10% of the prior but fail 20x as often: the largest failure cluster is snow.
    assert "snow" in top.caption and top.caption.startswith(CAT)
    assert top.predicted_label == "snow leopard"
    # Greedy selection puts the sentence that fits the cluster best first.
    assert top.sentences[0] == "it is in the snow"
    assert top.mean_loglik[0] >= top.mean_loglik[-1]


def test_measure_rate_supports_a_real_effect_and_stops_early(ctx):
    r = call(ctx, "measure_rate", caption=SNOW, target_label="snow leopard")
    assert r.verdict == "supported"
    assert r.stopped == "success" and r.looks == [100]  # a 7x effect is clear at the first look
    assert r.rate_ratio.low > 3
    assert r.p_value < 1e-6 and r.adjusted_p == r.p_value  # family of one
    assert r.baseline.n == 1000


def test_measure_rate_futility_and_family_adjustment(ctx):
    a = call(ctx, "measure_rate", caption=SNOW)
    b = call(ctx, "measure_rate", caption=GRASS, max_n=400)
    assert b.verdict == "not supported"
    assert b.family_size == 2
    # Holm over two tests: the smaller p doubles.
    inv = ctx.investigation
    t_a = inv.test(a.test_id)
    assert t_a.adjusted_p == pytest.approx(min(1.0, 2 * t_a.p_value))


def test_confirmation_uses_fresh_seeds_and_its_own_baseline(ctx):
    call(ctx, "measure_rate", caption=SNOW)
    c = call(ctx, "measure_rate", caption=SNOW, confirm=True)
    assert c.purpose == "confirmation"
    assert c.hypothesis.seeds[0] >= CONFIRMATION_OFFSET
    assert ctx.investigation.baselines["confirmation"].seeds[0] >= CONFIRMATION_OFFSET


def test_record_finding_enforces_confirmation(ctx):
    d = call(ctx, "measure_rate", caption=SNOW)
    with pytest.raises(ToolError, match="confirm"):
        call(ctx, "record_finding", caption=SNOW, discovery_test=d.test_id, confirmation_test=d.test_id)
    g = call(ctx, "measure_rate", caption=GRASS, max_n=200)
    gc = call(ctx, "measure_rate", caption=GRASS, confirm=True, max_n=200)
    with pytest.raises(ToolError, match="shows no increase"):  # grass lowers the failure rate
        call(ctx, "record_finding", caption=GRASS, discovery_test=g.test_id, confirmation_test=gc.test_id)
    c = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)  # the sizes the first attempt fixed
    f = call(ctx, "record_finding", caption=SNOW, discovery_test=d.test_id, confirmation_test=c.test_id)
    assert f.confirmed and f.discovery.rate_ratio.ratio > 3
    assert ctx.emitted == [f]
    with pytest.raises(ToolError, match="already"):
        call(ctx, "record_finding", caption=SNOW, discovery_test=d.test_id, confirmation_test=c.test_id)


def test_a_counterfactual_added_later_updates_the_finding_under_its_id(ctx):
    d = call(ctx, "measure_rate", caption=SNOW)
    c = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)
    f = call(ctx, "record_finding", caption=SNOW, discovery_test=d.test_id, confirmation_test=c.test_id,
             summary="snow fails")
    assert f.counterfactual is None
    cf = call(ctx, "measure_rate", caption=SNOW, mode="counterfactual", max_n=40)
    # The evidence must be the recorded finding's own; only a counterfactual may be added.
    with pytest.raises(ToolError, match="only adds a counterfactual"):
        call(ctx, "record_finding", caption=SNOW, discovery_test=d.test_id, confirmation_test=c.test_id)
    other = call(ctx, "measure_rate", caption=SNOW, confirm=True, max_n=200)
    with pytest.raises(ToolError, match="only adds a counterfactual"):
        call(ctx, "record_finding", caption=SNOW, discovery_test=d.test_id, confirmation_test=other.test_id,
             counterfactual_test=cf.test_id)
    g = call(ctx, "record_finding", caption=SNOW, discovery_test=d.test_id, confirmation_test=c.test_id,
             counterfactual_test=cf.test_id)
    assert g.finding_id == f.finding_id and g.counterfactual is not None and g.counterfactual.test_id == cf.test_id
    assert g.confirmation == f.confirmation and g.summary == "snow fails"  # an empty summary keeps the first
    assert ctx.investigation.findings == [g] and ctx.emitted == [f, g]
    shown = ["".join(text for text, _ in line) for line in record_finding.render(g)]
    assert len(shown) == 3 and shown[2].startswith("counterfactual ") and "(adjusted " in shown[2]
    with pytest.raises(ToolError, match="only adds a counterfactual"):  # it has one now
        call(ctx, "record_finding", caption=SNOW, discovery_test=d.test_id, confirmation_test=c.test_id,
             counterfactual_test=cf.test_id)


def test_counterfactual_mode_uses_mcnemar_on_flips(ctx):
    r = call(ctx, "measure_rate", caption=SNOW, mode="counterfactual", max_n=200)
    assert r.mcnemar is not None
    # Same uniform draw before and after: an edit to snow can only flip images towards failure.
    assert r.mcnemar.c == 0 and r.mcnemar.b > 50
    assert r.mcnemar.p_value == pytest.approx(stats.mcnemar_exact(r.mcnemar.b, 0).p_value)
    assert r.verdict == "supported"


def test_edit_image_pairs_and_refuses_unknown_images(ctx):
    base = call(ctx, "generate_and_classify", prompt=CAT + " in the grass", n=50)
    refs = base.success_images
    e = call(ctx, "edit_image", images=refs, source_caption=GRASS, target_caption=SNOW)
    assert len(e.edits) == len(refs)
    assert all(x.original == r for x, r in zip(e.edits, refs))
    assert e.to_correct == 0 and e.mcnemar is not None
    with pytest.raises(ToolError, match="unknown image"):
        call(ctx, "edit_image", images=["0" * 64], source_caption=GRASS, target_caption=SNOW)


def test_perturb_caption_keeps_the_class_and_refines(ctx):
    caption = "a realistic photograph of a cat. it is in the grass. it is daytime."
    r = call(ctx, "perturb_caption", caption=caption, types=["background", "domain", "adjective"], n=2,
             rendered_only=False)
    kinds = {e.type for e in r.edits}
    assert kinds == {"background", "domain", "adjective"}
    assert all("cat" in e.caption for e in r.edits)
    bg = [e for e in r.edits if e.type == "background"]
    # The place the caption names is swapped, whatever preposition the caption used ("in the grass").
    assert len(bg) == 2 and any(e.edit.startswith("in the grass -> ") for e in bg)
    singles = [e.caption for e in r.refinements if e.type == "single_sentence"]
    assert singles == ["a realistic photograph of a cat. it is in the grass.",
                       "a realistic photograph of a cat. it is daytime."]
    with pytest.raises(ToolError, match="class"):
        call(ctx, "perturb_caption", caption="a photo of a dog")


def test_perturb_caption_leaves_out_what_the_generator_cannot_render(ctx):
    # The fake generator draws snow, grass and sand backgrounds and nothing else (tests/fakeworld.py).
    r = call(ctx, "perturb_caption", caption=CAT, types=["background", "adjective", "domain"], n=100,
             refinements=False)
    from sleuth.tools.perturb_caption import new_words
    from tests.fakeworld import unrendered

    kept = {e.caption for e in r.edits}
    assert {CAT + " in the snow.", CAT + " on the grass."} <= kept and CAT + " on a beach." not in kept
    # Every edit kept adds a word the generator draws ("a grainy photo of": photo); none is all unrendered words.
    assert all(new_words(CAT, c) - set(unrendered(c)) for c in kept)
    assert "+ made of wood" in r.not_rendered and "+ at night" in r.not_rendered
    assert len(r.edits) + len(r.not_rendered) > 100  # the general vocabulary, whatever the models


def test_perturb_caption_with_llm_validates_the_reply(ctx):
    ctx.llm = lambda prompt: ('{"edits": [{"type": "background", "edit": "grass -> sand", '
                              '"caption": "a photo of a cat on sand."}, {"type": "object", "edit": "+ dog", '
                              '"caption": "a photo of a cat and a dog."}]}')
    r = call(ctx, "perturb_caption", caption="a photo of a cat on grass.", types=["background", "object"],
             refinements=False)
    assert r.source == "llm+vocabulary"
    # The LLM's valid rewrite comes first, then the general vocabulary's (never replaced by the LLM's few).
    merged = [e.caption for e in r.edits]
    assert merged[0] == "a photo of a cat on sand." and merged.count("a photo of a cat on sand.") == 1
    assert "'a photo of a cat and a dog.': names another class 'dog'" in r.rejected
    # A reply that is not the expected JSON leaves the vocabulary's edits standing, and says so.
    ctx.llm = lambda prompt: "sure! here are some edits"
    r = call(ctx, "perturb_caption", caption="a photo of a cat on grass.", types=["background", "object"],
             refinements=False)
    assert r.source == "vocabulary" and "JSON" in r.notes[0]
    # Merged, every edit of the vocabulary is still there (the generator here renders few of them).
    ctx.llm = None
    alone = call(ctx, "perturb_caption", caption="a photo of a cat on grass.", types=["background", "object"],
                 refinements=False)
    assert alone.edits and [e.caption for e in alone.edits] == [e.caption for e in r.edits]
    assert merged[1:] == [c for c in (e.caption for e in alone.edits) if c != merged[0]]


def test_predictions_are_cached_by_backend_prompt_and_seed(tmp_path):
    from sleuth.tools.cache import PredictionCache

    cache = PredictionCache(tmp_path / "predictions.sqlite")
    backends = fake_backends()
    calls = []
    generate = backends.generator.generate
    backends.generator.generate = lambda prompts, seeds: calls.append(len(seeds)) or generate(prompts, seeds)

    def measure():
        inv = Investigation(backends=backends, label="cat", budget=Budget(images=5000), cache=cache)
        return inv, inv.sample(SNOW, 300)

    inv1, first = measure()
    assert sum(calls) == 300 and cache.misses == 300
    calls.clear()
    # A new cache object on the same file: what a re-run, a resume or `replay --verify` sees.
    cache = PredictionCache(tmp_path / "predictions.sqlite")
    inv2, second = measure()
    assert cache.hits == 300 and sum(calls) == 0
    assert second.k == first.k and second.labels == first.labels and second.topk == first.topk
    # Images needed later (failures to store) are generated again from their seeds, identical.
    m = inv2.store(second)
    assert sum(calls) == second.k + inv2.store_successes
    i = int(np.flatnonzero(second.failed)[0])
    assert np.array_equal(second.generations[i].image, first.generations[i].image)
    assert inv2.artifacts is None and m.image_refs[i] is not None
    # Another prompt or another classifier id is another key.
    backends.classifier.id = "fake-clf-v2"
    calls.clear()
    measure()
    assert sum(calls) == 300


def _open_cache(path, barrier, errors):
    from sleuth.tools.cache import PredictionCache

    barrier.wait()
    try:
        PredictionCache(path).close()
    except Exception as err:  # what the worker of an audit would raise
        errors.put(repr(err))


def test_processes_that_open_a_new_cache_file_at_once_all_open_it(tmp_path):
    """The workers of an audit share one cache file and start together. Switching a new file to WAL does not wait
    for another process's lock as other statements do: without waiting for it, about one start in four failed with
    "database is locked"."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    errors = ctx.Queue()
    for trial in range(20):  # without the fix all 20 succeed with probability 0.75 ** 20 = 0.3%
        path = tmp_path / str(trial) / "predictions.sqlite"
        barrier = ctx.Barrier(8)
        workers = [ctx.Process(target=_open_cache, args=(path, barrier, errors)) for _ in range(8)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert [w.exitcode for w in workers] == [0] * 8
    assert errors.empty(), errors.get()


def test_measure_rate_makes_its_last_affordable_look_final(tmp_path):
    # Baseline 1000 + first look 100 leave 90 images: the 200-image look is unaffordable, so look 1 is final
    # and its decision uses the rest of the alpha; so does the overall p-value (the union bound over the thresholds
    # the looks were tested at: here all of alpha at look 1).
    inv = Investigation(backends=fake_backends(), label="cat", budget=Budget(images=1190))
    c = ToolContext(investigation=inv)
    r = call(c, "measure_rate", caption=GRASS, max_n=800, first_n=100)
    assert r.looks == [100] and r.stopped == "budget"
    plan = stats.default_plan(800, first=100, alpha=inv.alpha)
    p1 = stats.fisher_p_greater(r.hypothesis.failures.k, 100, r.baseline.k, r.baseline.n)
    assert plan.final_threshold(0) == pytest.approx(inv.alpha) and r.p_value == pytest.approx(p1)
    assert inv.budget.used == 1100


@pytest.mark.parametrize("caption", [CAT, CAT + ".", "A realistic  photograph of a cat ."])
def test_measure_rate_refuses_the_class_prompt_itself(ctx, caption):
    """The class prompt is the baseline: measuring it as a hypothesis tests nothing and would spend a confirmation
    attempt (small models do this over and over)."""
    for confirm in (False, True):
        with pytest.raises(ToolError, match="the class prompt itself"):
            call(ctx, "measure_rate", caption=caption, confirm=confirm)
    assert ctx.investigation.tests == [] and ctx.investigation.budget.used == 0
    # A caption that adds a condition is a hypothesis.
    assert call(ctx, "measure_rate", caption=SNOW, max_n=50).verdict in ("supported", "inconclusive", "not supported")
