"""The lean per-trial path draws exactly what the general path draws.

``SiteSpace.plan(count=K)`` for small K goes through :mod:`fastflip.core.trialplan` (raw Philox
words, NumPy's algorithms replayed in Python, a SeedSequence-free key). The seed contract says a
seed regenerates the same sites: these tests compare every column and the meta of the lean plan
with the general path's (the lean path switched off) over many seeds, streams, counts, fault
models, bit specs and dtype mixes, and check the pieces against NumPy directly.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from fastflip.core import sampling
from fastflip.core.plan import Plan, TensorRef
from fastflip.core.rawdraws import FLOYD_MAX, RawDraws
from fastflip.core.sampling import SiteSpace, generator
from fastflip.core.seedkey import keyed_generator, seed_state
from fastflip.core.spec import Sampling
from fastflip.errors import CapacityError, OptionError

MODELS = [None, "flip", "stuck-at-0", "stuck-at-1", "stuck-at-1:2", "random-bits:3", "adjacent:2", "mask:0b101@random",
          "mask:0b11", "random-value", "zero", "scale:2.0"]


def _general(space: SiteSpace, spec: Sampling, **where) -> Plan:
    """The plan of the general path (the lean path switched off)."""
    lean = sampling.lean_plan
    sampling.lean_plan = lambda *a, **k: None
    try:
        return space.plan(spec, **where)
    finally:
        sampling.lean_plan = lean


def _columns(p: Plan) -> list:
    cols = [p.tensor, p.index, p.and_mask, p.or_mask, p.xor_mask, p.bits]
    return [(c.dtype.str, c.tolist()) for c in cols] + [None if p.scale is None else p.scale.tolist()]


def _outcome(draw):
    try:
        return draw(), None
    except OptionError as exc:  # e.g. scale sites drawn with replacement onto one element
        return None, (type(exc), str(exc))


def _same(space: SiteSpace, seed: int, stream: tuple = (), **kw) -> Plan | None:
    spec = Sampling(**{k: v for k, v in kw.items() if v is not None})  # model None: the default, flip
    (fast, fast_err), (slow, slow_err) = (_outcome(lambda: space.plan(spec, seed=seed, stream=stream)),
                                          _outcome(lambda: _general(space, spec, seed=seed, stream=stream)))
    assert fast_err == slow_err, kw
    if fast is None:
        return None
    assert _columns(fast) == _columns(slow), kw
    assert fast.meta == slow.meta and list(fast.meta) == list(slow.meta), kw
    assert fast.tensors is slow.tensors
    return fast


@pytest.fixture(scope="module")
def mixed() -> SiteSpace:
    """Three dtype groups (float32, float16, bfloat16 words), tensors of very different sizes."""
    return SiteSpace([TensorRef("a", "<f4", (3, 5)), TensorRef("b", "<f2", (1000,)), TensorRef("c", "bfloat16", (7,)),
                      TensorRef("d", "<f4", (200, 300))])


def test_lean_path_is_taken(mixed: SiteSpace, monkeypatch) -> None:
    """The comparison below compares two paths: the lean one does run for a small count."""
    calls = []
    real = sampling.lean_plan
    monkeypatch.setattr(sampling, "lean_plan", lambda *a, **k: calls.append(a) or real(*a, **k))
    mixed.plan(Sampling(count=2), seed=1)
    assert len(calls) == 1


@pytest.mark.parametrize("kw", [{"count": 1}, {"count": 30, "model": "random-bits:2"}, {"rate": 1e-3},
                                {"ber": 1e-5}, {"count": 5, "replace": True}])
def test_lean_path_serves_trials_alone(mixed: SiteSpace, kw, monkeypatch) -> None:
    """A trial's plan never builds the general path's generator (SeedSequence + Philox + Generator)."""
    monkeypatch.setattr(sampling, "generator", lambda *a: pytest.fail("the general path ran"))
    assert mixed.plan(Sampling(**kw), seed=4, stream=(2,)).meta["requested_sites"] >= 1


@pytest.mark.parametrize("model", MODELS)
def test_same_plan_as_general_path(mixed: SiteSpace, model) -> None:
    r = random.Random(hash(str(model)) & 0xFFFF)
    for _ in range(40):
        seed = r.choice([0, 1, r.randrange(1 << 20), r.randrange(1 << 63), r.randrange(1 << 80)])
        stream = tuple(r.randrange(1 << r.choice([1, 8, 32, 40, 70])) for _ in range(r.randrange(0, 4)))
        count = r.choice([1, 1, 2, 3, 10, 50, 200])
        _same(mixed, seed=seed, stream=stream, count=count, model=model, replace=r.random() < 0.2)


@pytest.mark.parametrize("model", [None, "stuck-at-1", "random-bits:2", "adjacent:3", "random-value", "scale:0.5"])
def test_same_plan_rate_and_ber(mixed: SiteSpace, model) -> None:
    """rate= and ber= draw K from a Binomial first, then the sites: the lean path goes on from there."""
    r = random.Random(hash(str(model)) & 0xFFFF)
    pair = model in (None, "stuck-at-1")
    for i in range(40):
        replace = r.random() < 0.2
        _same(mixed, seed=r.randrange(1 << 40), stream=(i,), rate=r.choice([0.0, 1e-5, 1e-4, 1e-3, 0.01]), model=model,
              replace=replace)
        if pair:
            _same(mixed, seed=r.randrange(1 << 40), stream=(i, 2), ber=r.choice([0.0, 1e-6, 1e-5, 1e-4]), model=model,
                  replace=replace)


@pytest.mark.parametrize("bits", ["exponent-msb", "30-31", "sign", "0-7", None])
def test_same_plan_bit_specs_and_one_group(bits) -> None:
    space = SiteSpace([TensorRef(f"w{i}", "<f4", (i + 1, 17)) for i in range(40)], bits=bits)
    for i in range(60):
        _same(space, seed=7, stream=(i,), count=1 + i % 12)
        _same(space, seed=i, stream=(3, i), count=5, replace=True)


def test_same_plan_when_sites_are_few() -> None:
    """Tiny spaces: collisions, surplus removal of many draws, replacement with repeats (merged sites)."""
    space = SiteSpace([TensorRef("t", "<u1", (4,)), TensorRef("u", "<i2", (3,))])
    for i in range(300):
        _same(space, seed=i, count=1 + i % 5)  # <= a quarter of the 56 (element, bit) sites
        _same(space, seed=i, count=1 + i % 20, replace=True)
        _same(space, seed=i, count=1, model="zero")


def test_rejection_and_fallbacks_give_the_general_plan() -> None:
    """Counts the lean path leaves to the general one give the same plans through plan()."""
    space = SiteSpace([TensorRef("t", "<f4", (64,))])
    for kw in ({"count": 0}, {"count": 600}, {"count": 64, "model": "zero"}, {"count": 5000, "replace": True}):
        _same(space, seed=3, **kw)
    with pytest.raises(CapacityError):
        space.plan(Sampling(count=65, model="zero"), seed=1)
    with pytest.raises(OptionError, match="seed"):
        space.plan(Sampling(count=1), seed=-1)
    with pytest.raises(ValueError):  # NumPy's SeedSequence refuses negative entropy on both paths
        space.plan(Sampling(count=1), seed=1, stream=(-1,))


def test_lean_plan_applies_like_a_general_plan() -> None:
    """Live inject/revert take the lean plan (its arrays are never written after construction)."""
    from fastflip import live

    arrays = {"a": np.arange(12, dtype=np.float32), "b": np.ones(5, np.float16)}
    tg = live.targets(arrays)
    space = SiteSpace(tg.refs())
    before = {k: v.copy() for k, v in arrays.items()}
    for i in range(20):
        plan = space.plan(Sampling(count=3), seed=5, stream=(i,))
        for col in (plan.tensor, plan.index, plan.and_mask, plan.or_mask, plan.xor_mask, plan.bits):
            col.flags.writeable = False
        log = live.inject(tg, plan)
        assert log.changed == len(plan) and log.bits_changed == plan.meta["flips"] == 3
        live.revert(tg, log)
    assert all((arrays[k].view(np.uint8) == before[k].view(np.uint8)).all() for k in arrays)


# ---------------------------------------------------------------------- the pieces against NumPy


def test_seed_state_is_seedsequence() -> None:
    r = random.Random(2)
    for _ in range(400):
        ent = [r.choice([0, 1, r.randrange(1 << 32), r.randrange(1 << 64), r.randrange(1 << 130)])
               for _ in range(r.randrange(1, 9))]
        n = r.choice([2, 2, r.randrange(1, 9)])
        assert seed_state(ent, n) == [int(x) for x in np.random.SeedSequence(ent).generate_state(n, np.uint64)]


def test_keyed_generator_is_generator() -> None:
    for seed, stream in [(0, ()), (3, (17,)), (1 << 70, (1, 2, 3, 4, 5)), (9, (1 << 33,))]:
        a, b = keyed_generator(seed, stream), generator(seed, stream)
        assert a.integers(0, 1 << 62, size=9).tolist() == b.integers(0, 1 << 62, size=9).tolist()
        assert a.random(3).tolist() == b.random(3).tolist()
        assert a.binomial(1000, 0.3) == b.binomial(1000, 0.3)


@pytest.mark.parametrize("high", [1, 2, 7, 25_636_712, (1 << 31) + 5, (1 << 32) - 1, 1 << 32, (1 << 32) + 1,
                                  (1 << 40) + 3, (1 << 63) + 11])
def test_raw_draws_match_numpy(high: int) -> None:
    r = random.Random(high & 0xFFFF)
    for seed in range(40):
        d = RawDraws(np.random.Philox(seed))
        g = np.random.Generator(np.random.Philox(seed))
        for _ in range(4):
            n = r.randrange(1, 40)
            size = r.randrange(0, n + 1)
            assert d.integers(high, 3) == g.integers(0, high, size=3, dtype=np.uint64).tolist()
            assert d.random(2) == g.random(2).tolist()
            assert d.choice_floyd(n, size) == g.choice(n, size, replace=False).tolist()
        d.sync()  # the bit generator goes on where NumPy's calls would have left it
        g2 = np.random.Generator(d.bitgen)
        assert g2.integers(0, 1000, size=5).tolist() == g.integers(0, 1000, size=5).tolist()
        assert g2.random(3).tolist() == g.random(3).tolist()


def test_raw_draws_go_on_from_a_used_generator() -> None:
    """RawDraws(fresh=False) starts where NumPy's draws left the bit generator (after a Binomial, a 32-bit draw)."""
    for seed in range(60):
        for before in ("binomial", "int32", "double"):
            bg, ref = np.random.Philox(seed), np.random.Generator(np.random.Philox(seed))
            for g in (np.random.Generator(bg), ref):
                if before == "binomial":
                    g.binomial(10**6, 1e-4 * (1 + seed % 7))
                elif before == "int32":
                    g.integers(0, 1000, size=1 + seed % 3)
                else:
                    g.random(1 + seed % 5)
            d = RawDraws(bg, fresh=False)
            assert d.integers(1 << 20, 5) == ref.integers(0, 1 << 20, size=5).tolist()
            assert d.random(3) == ref.random(3).tolist()
            assert d.random(37 + seed) == ref.random(37 + seed).tolist()  # past the first block of raw words
            d.sync()
            assert np.random.Generator(bg).integers(0, 99, size=4).tolist() == ref.integers(0, 99, size=4).tolist()


def test_choice_floyd_limits() -> None:
    d = RawDraws(np.random.Philox(1))
    numpy_set = np.random.Generator(np.random.Philox(1)).choice(30, 20, replace=False)
    assert sorted(d.choice_floyd(30, 20, shuffle=False)) == sorted(numpy_set.tolist())
    with pytest.raises(ValueError, match="unshuffled"):
        d.sync()
    d = RawDraws(np.random.Philox(1))
    numpy_draw = np.random.Generator(np.random.Philox(1)).choice(FLOYD_MAX, 3, replace=False)
    assert d.choice_floyd(FLOYD_MAX, 3) == numpy_draw.tolist()
    refused = rf"choice_floyd covers 0 <= size <= n <= {FLOYD_MAX} \(got n={FLOYD_MAX + 1}, size=3\)"
    with pytest.raises(ValueError, match=refused):
        d.choice_floyd(FLOYD_MAX + 1, 3)


@pytest.mark.parametrize("model", ["flip", "stuck-at-0", "stuck-at-1", "zero", "random-bits:2"])
def test_plan_sites_lean_equals_general(mixed: SiteSpace, model, monkeypatch) -> None:
    """plan_sites (a campaign trial's given units) builds pair-site plans on Python integers: the same plan."""
    r = random.Random(5)
    cases = [sorted(r.sample(range(mixed.n_sites(model)), r.choice([1, 2, 5, 40]))) for _ in range(60)]
    cases += [[0], [mixed.n_sites(model) - 1], list(range(30))]  # first and last unit, many bits of one element
    fast = [mixed.plan_sites(u, seed=3, stream=(1, i), model=model) for i, u in enumerate(cases)]
    monkeypatch.setattr(sampling, "pair_units_plan", lambda *a, **k: None)
    monkeypatch.setattr(sampling, "BULK", 0)  # the general builder for every count (the name plan_sites reads)
    slow = [mixed.plan_sites(u, seed=3, stream=(1, i), model=model) for i, u in enumerate(cases)]
    for a, b in zip(fast, slow):
        assert _columns(a) == _columns(b) and a.meta == b.meta and list(a.meta) == list(b.meta)


def test_permutation_stragglers_walk_in_python() -> None:
    """Permutation(...)(positions): values outside [0, n) after the first NumPy pass finish in Python, the same."""
    from fastflip.core.permutation import Permutation

    p = Permutation(819_000_000, (3, 0, 0))  # domain 2**30: about a quarter of first passes land outside
    for start in range(0, 2000, 97):
        pos = np.arange(start, start + 12)
        assert p(pos).tolist() == [p.value(int(i)) for i in pos]


def test_small_plans_prepare_like_the_general_check(monkeypatch) -> None:
    """Targets._prepare_small (a trial's few sites, Python integers) resolves what _prepare resolves, and leaves
    every plan it would refuse to the general check (which raises)."""
    from fastflip import live
    import importlib

    targets_mod = importlib.import_module("fastflip.live.targets")
    from fastflip.errors import PlanMismatchError, ReadOnlyTargetError

    arrays = {"a": np.zeros((3, 4), np.float32), "b": np.zeros(9, ">f2"), "c": np.zeros(5, np.uint8),
              "d": np.zeros(2, np.int64)}
    tg = live.targets(arrays)
    space = SiteSpace(tg.refs())
    plans = [space.plan(Sampling(count=1 + i % 16), seed=i) for i in range(40)]
    small = [tg._prepare_small(p, tg._mapping(p.tensors)) for p in plans]
    monkeypatch.setattr(targets_mod, "_SMALL", 0)
    for p, s in zip(plans, small):
        g = tg._prepare(p)
        assert s is not None and s.cpu is None and g.cpu is None and s.bitwise and g.bitwise
        for col in ("tensor", "offsets", "and_mask", "or_mask", "xor_mask"):
            a, b = getattr(s.sites, col), getattr(g.sites, col)
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), col
    refs = space.tensors
    bad = [Plan.from_sites(refs, [0], [12], xor_mask=[1]), Plan.from_sites(refs, [1, 1], [3, 3], xor_mask=[1, 2]),
           Plan(refs, np.array([9]), np.array([0]), np.array([~np.uint64(0)]), np.zeros(1, np.uint64),  # no tensor 9
                np.ones(1, np.uint64), None, np.ones(1, np.uint64))]
    for p in bad:
        assert tg._prepare_small(p, tg._mapping(p.tensors)) is None
    ro = {"w": np.zeros(4, np.float32)}
    ro["w"].flags.writeable = False
    tro = live.targets(ro)
    p = Plan.from_sites(tro.refs(), [0], [1], xor_mask=[1])
    assert tro._prepare_small(p, tro._mapping(p.tensors)) is None
    monkeypatch.setattr(targets_mod, "_SMALL", 16)
    with pytest.raises(ReadOnlyTargetError):
        live.inject(tro, p)
    for p in bad:
        with pytest.raises(PlanMismatchError):
            live.inject(tg, p)


@pytest.mark.parametrize("kw", [{"count": 3}, {"rate": 1e-3}, {"ber": 1e-4}, {"count": 2, "model": "random-value"}])
def test_both_paths_take_the_amount_from_one_function(mixed: SiteSpace, kw, monkeypatch) -> None:
    """The lean and the general path work out how many sites to draw (count, or rate/ber's Binomial) with the
    one draw_amount, once per plan; the plan's meta records what it gave."""
    from fastflip.core import trialplan

    got = []
    real = trialplan.draw_amount

    def counting(*a):
        got.append(real(*a))
        return got[-1]

    for module in (sampling, trialplan):
        monkeypatch.setattr(module, "draw_amount", counting)
    spec = Sampling(**kw)
    for draw in (lambda: mixed.plan(spec, seed=5, stream=(1,)), lambda: _general(mixed, spec, seed=5, stream=(1,))):
        got.clear()
        plan = draw()
        assert len(got) == 1
        k, _pairs, _uniform, mode = got[0]
        assert plan.meta["requested_sites"] == k and {m: plan.meta[m] for m in mode} == mode


# ---------------------------------------------------------------------- plain-Python Philox words


def test_philox_words_are_numpys() -> None:
    """PhiloxWords gives NumPy's Philox words (keyed as keyed_generator keys it), however they are asked for."""
    from fastflip.core.seedkey import PhiloxWords

    r = random.Random(5)
    for _ in range(300):
        ent = [r.choice([0, 1, r.randrange(1 << 20), r.randrange(1 << 64), r.randrange(1 << 90)])
               for _ in range(r.randrange(1, 5))]
        key = seed_state(ent, 2)
        want = np.random.Philox(key=np.array(key, np.uint64)).random_raw(60).tolist()
        assert want == keyed_generator(ent[0], ent[1:]).bit_generator.random_raw(60).tolist()
        words, got = PhiloxWords(key), []
        while len(got) < 60:
            got += words.random_raw(min(r.randrange(0, 11), 60 - len(got)))
        assert got == want


_PLANS_WITHOUT_NUMPY_RANDOM = """
import json, sys
from fastflip.core.plan import TensorRef
from fastflip.core.sampling import SiteSpace
from fastflip.core.spec import Sampling
space = SiteSpace([TensorRef("a", "<f4", (3, 5)), TensorRef("b", "<f2", (1000,)), TensorRef("c", "bfloat16", (7,)),
                   TensorRef("d", "<f4", (200, 300))])
out, loaded = [], []
for case in json.loads(sys.argv[1]):
    p = space.plan(Sampling(**case["kw"]), seed=case["seed"], stream=tuple(case["stream"]))
    out.append([c.tolist() for c in (p.tensor, p.index, p.and_mask, p.or_mask, p.xor_mask, p.bits)])
    loaded.append("numpy.random" in sys.modules)
print(json.dumps({"loaded": loaded, "plans": out}))
"""


def test_a_count_plan_without_numpy_random_is_the_same(mixed: SiteSpace) -> None:
    """A process that never imported numpy.random (a one-shot command) plans a count of pair sites from
    plain-Python Philox words, without importing it, for its first few plans; then through NumPy's Philox (faster
    trial after trial). The same plans as the general path's either way."""
    from fastflip.core.seedkey import _PLAIN_MAX

    import json
    import subprocess
    import sys

    r = random.Random(9)
    cases = [{"kw": {k: v for k, v in {"count": r.choice([1, 1, 2, 5, 40]), "model": m,
                                       "replace": r.random() < 0.2}.items() if v is not None},
              "seed": r.choice([0, 1, r.randrange(1 << 20), r.randrange(1 << 63)]),
              "stream": [r.randrange(1 << 32) for _ in range(r.randrange(0, 3))]}
             for m in (None, "flip", "stuck-at-0", "stuck-at-1") for _ in range(25)]
    assert all(Sampling(**c["kw"]).fault_model.pair_sites for c in cases)  # the models drawn as (bit, element) pairs
    res = subprocess.run([sys.executable, "-c", _PLANS_WITHOUT_NUMPY_RANDOM, json.dumps(cases)], capture_output=True,
                         text=True, check=True)
    got = json.loads(res.stdout)
    assert got["loaded"] == [False] * _PLAIN_MAX + [True] * (len(cases) - _PLAIN_MAX)
    for case, plan in zip(cases, got["plans"]):
        want = _general(mixed, Sampling(**case["kw"]), seed=case["seed"], stream=tuple(case["stream"]))
        assert plan == [c.tolist() for c in (want.tensor, want.index, want.and_mask, want.or_mask, want.xor_mask,
                                              want.bits)], case
