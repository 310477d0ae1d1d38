"""Sampling and fault models: determinism, exact counts, uniqueness, distributions, masks."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require

from fastflip.errors import BitRangeError, CapacityError, NaNPolicyError, OptionError
from fastflip.core.faults import FaultModel
from fastflip.core.plan import Plan, TensorRef, compose_masks, merge_duplicate_elements
from fastflip.core.reference import apply_plan, word_rule
from fastflip.core.sampling import SiteSpace
from fastflip.core.spec import Sampling

REFS = [TensorRef("a", "<f4", (10,)), TensorRef("b", "<f4", (100,)), TensorRef("c", "<f4", (30, 30)),
        TensorRef("d", "<f4", (5000,))]


def site_keys(plan: Plan) -> set[tuple[int, int, int]]:
    out = set()
    for t, i, b in zip(plan.tensor, plan.index, plan.bits):
        for bit in range(64):
            if int(b) >> bit & 1:
                out.add((int(t), int(i), bit))
    return out


def test_same_seed_same_sites_other_seed_other_sites():
    sp = SiteSpace(REFS)
    k = Sampling(count=200)
    p1, p2, p3 = sp.plan(k, seed=5), sp.plan(k, seed=5), sp.plan(k, seed=6)
    assert site_keys(p1) == site_keys(p2)
    assert site_keys(p1) != site_keys(p3)
    # the stream is part of the key; a fresh SiteSpace gives the same sites
    assert site_keys(SiteSpace(REFS).plan(Sampling(count=200), seed=5)) == site_keys(p1)
    assert site_keys(sp.plan(Sampling(count=200), seed=5, stream=(1, 2))) != site_keys(p1)


@pytest.mark.parametrize("k", [1, 7, 500, 5000, 20000])
def test_exact_count_distinct_sites(k):
    p = SiteSpace(REFS, bits="0-7").plan(Sampling(count=k), seed=1)
    assert p.meta["flips"] == k
    assert len(site_keys(p)) == k  # no (element, bit) twice
    assert len(set(zip(p.tensor.tolist(), p.index.tolist()))) == len(p)  # unique elements in the plan


def test_dense_and_full_capacity():
    refs = [TensorRef("x", "<u1", (4,)), TensorRef("y", "<u1", (3,))]
    p = SiteSpace(refs).plan(Sampling(count=7 * 8), seed=0)  # every bit of every element
    assert len(site_keys(p)) == 56 and len(p) == 7
    with pytest.raises(CapacityError, match="only 56"):
        SiteSpace(refs).plan(Sampling(count=57), seed=0)


def test_replace_allows_repeats():
    refs = [TensorRef("x", "<u1", (1,))]
    p = SiteSpace(refs, bits="0").plan(Sampling(count=3, replace=True), seed=0)
    assert len(p) == 1 and int(p.xor_mask[0]) == 1  # three flips of one bit == one flip


def test_element_distribution_is_proportional_to_size():
    """Chi-square of hits per tensor against sizes (p > 0.001 with a fixed seed)."""
    chi2 = require("scipy.stats").chisquare
    sp = SiteSpace(REFS)
    hits = np.zeros(len(REFS))
    for s in range(20):
        p = sp.plan(Sampling(count=300), seed=s)
        hits += np.bincount(p.tensor, weights=np.bitwise_count(p.bits), minlength=len(REFS))
    sizes = np.array([r.size for r in REFS], float)
    expected = hits.sum() * sizes / sizes.sum()
    assert chi2(hits, expected).pvalue > 1e-3
    # and the old tool's per-tensor behaviour is available and really different
    pt = SiteSpace(REFS, distribution="tensor")
    th = np.zeros(len(REFS))
    for s in range(20):
        q = pt.plan(Sampling(count=40), seed=s)
        th += np.bincount(q.tensor, weights=np.bitwise_count(q.bits), minlength=len(REFS))
    assert chi2(th, np.full(len(REFS), th.sum() / len(REFS))).pvalue > 1e-3


def test_tensor_distribution_draws_distinct_sites_in_succession():
    """A tensor chosen uniformly, then a site in it, a site drawn twice drawn again: a tiny tensor (2 sites) beside a
    large one (64) gets the first site with probability 1/2, and both sites of count=2 with 1/2 * 1/3 (after one of
    its sites is taken, it is chosen and its free site hit with probability 1/4, out of 1 - 1/4 of accepted draws)."""
    refs = [TensorRef("big", "<f4", (64,)), TensorRef("small", "<f4", (2,))]
    sp = SiteSpace(refs, bits="30", distribution="tensor")
    n = 3000
    first = sum(int(sp.plan(Sampling(count=1), seed=9, stream=(i,)).tensor[0]) for i in range(n)) / n
    both = sum(int((sp.plan(Sampling(count=2), seed=9, stream=(i,)).tensor == 1).sum() == 2) for i in range(n)) / n
    assert abs(first - 1 / 2) < 4 * (1 / 4 / n) ** 0.5  # 4 standard deviations
    assert abs(both - 1 / 6) < 4 * (5 / 36 / n) ** 0.5
    weighted = SiteSpace(refs, bits="30", distribution={"big": 1.0, "small": 3.0})
    share = sum(int(weighted.plan(Sampling(count=1), seed=9, stream=(i,)).tensor[0]) for i in range(n)) / n
    assert abs(share - 3 / 4) < 4 * (3 / 16 / n) ** 0.5


def test_weights():
    sp = SiteSpace(REFS, distribution={"a": 0.0, "b": 1.0, "d": 3.0})
    p = sp.plan(Sampling(count=400), seed=3)
    hits = np.bincount(p.tensor, minlength=4)
    assert hits[0] == 0 and hits[2] == 0 and hits[3] > hits[1] > 0
    with pytest.raises(OptionError, match="not selected"):
        SiteSpace(REFS, distribution={"zz": 1.0})


def test_rate_and_ber_binomial_counts():
    refs = [TensorRef("w", "<f4", (100_000,))]
    p = SiteSpace(refs).plan(Sampling(rate=0.01), seed=1)
    assert abs(len(p) - 1000) < 150 and p.meta["drawn"] == len(p)
    q = SiteSpace(refs, bits="0-15").plan(Sampling(ber=1e-3), seed=1)
    assert abs(q.meta["flips"] - 1600) < 200


@pytest.mark.parametrize("dtype", ["<f2", ">f4", "<f8", "<i1", ">u2", "<i8", "|b1"])
def test_bits_stay_in_range_and_width(dtype):
    refs = [TensorRef("w", dtype, (64,))]
    width = np.dtype(dtype).itemsize * 8
    p = SiteSpace(refs, bits=f"0-{width - 1}").plan(Sampling(count=64), seed=2)
    assert all(int(b) >> width == 0 for b in p.bits)
    with pytest.raises(BitRangeError):
        SiteSpace(refs, bits=str(width)).plan(Sampling(count=1), seed=2)


def test_fault_models_masks():
    refs = [TensorRef("w", "<f4", (1000,))]
    allowed = 0x00FF_FF00
    sp = SiteSpace(refs, bits="8-23")
    burst = sp.plan(Sampling(count=50, model="burst:3"), seed=1)
    assert all(bin(int(x)).count("1") == 3 and int(x) & ~allowed == 0 for x in burst.xor_mask)
    adj = sp.plan(Sampling(count=50, model="adjacent:4"), seed=1)
    for x in adj.xor_mask:
        x = int(x)
        low = (x & -x).bit_length() - 1
        assert x == 0b1111 << low and x & ~allowed == 0
    mask_r = sp.plan(Sampling(count=50, model="mask:0b101@random"), seed=1)
    assert all(int(x) & ~allowed == 0 and bin(int(x)).count("1") == 2 for x in mask_r.xor_mask)
    mask_f = sp.plan(Sampling(count=5, model="mask:0x3"), seed=1)
    assert {int(x) for x in mask_f.xor_mask} == {3}
    s0 = sp.plan(Sampling(count=20, model="stuck-at-0"), seed=1)
    assert all(int(~a) & 0xFFFFFFFF & ~allowed == 0 for a in s0.and_mask)
    s1 = sp.plan(Sampling(count=20, model="stuck-at-1:2"), seed=1)
    assert all(bin(int(o)).count("1") == 2 for o in s1.or_mask)
    rv = sp.plan(Sampling(count=20, model="random-value"), seed=1)
    assert all(int(o) & ~allowed == 0 for o in rv.or_mask)
    z = sp.plan(Sampling(count=5, model="zero"), seed=1)
    assert all(int(a) == 0 for a in z.and_mask)
    sc = sp.plan(Sampling(count=5, model="scale:-2"), seed=1)
    assert np.all(sc.scale == -2.0)
    with pytest.raises(OptionError):
        SiteSpace(refs, bits="0-1").plan(Sampling(count=1, model="adjacent:3"), seed=1)


def test_merge_composes_like_sequential_application():
    rng = np.random.default_rng(0)
    refs = [TensorRef("w", "<u2", (3,))]
    n = 12
    masks = [rng.integers(0, 2**16, n, dtype=np.uint64) | np.uint64(0xFFFFFFFFFFFF0000) for _ in range(1)]
    plan = Plan.from_sites(refs, np.zeros(n, int), rng.integers(0, 3, n), and_mask=masks[0],
                           or_mask=rng.integers(0, 2**16, n, dtype=np.uint64) & ~masks[0],
                           xor_mask=rng.integers(0, 2**16, n, dtype=np.uint64))
    start = np.array([0x1234, 0xFFFF, 0x0000], dtype="<u2")
    seq = start.copy()
    for i in range(n):  # sequential, site by site
        j = int(plan.index[i])
        seq[j] = word_rule(int(seq[j]), int(plan.and_mask[i]), int(plan.or_mask[i]), int(plan.xor_mask[i]), 16)
    merged = merge_duplicate_elements(plan)
    arr = {"w": start.copy()}
    apply_plan(arr, merged)
    assert arr["w"].tolist() == seq.tolist()


def test_compose_identity():
    ones = np.array([np.uint64(0xFFFFFFFFFFFFFFFF)])
    z = np.array([np.uint64(0)])
    a, o, x = compose_masks((ones, z, np.array([np.uint64(5)])), (ones, z, np.array([np.uint64(5)])))
    assert (int(a[0]), int(o[0]), int(x[0])) == (0xFFFFFFFFFFFFFFFF, 0, 0)


def test_nan_avoid_resamples_and_fails_cleanly():
    refs = [TensorRef("w", "<f4", (200,))]
    vals = np.concatenate([np.full(100, 1.5, "<f4"), np.full(100, 0.25, "<f4")])  # msb flip of 1.5 -> Inf
    words = vals.view(np.uint32).astype(np.uint64)

    def read(p: Plan) -> np.ndarray:
        return words[p.index]

    sp = SiteSpace(refs, bits="exponent-msb")
    p = sp.plan(Sampling(count=50, nan_policy="avoid"), seed=4, read_words=read)
    assert len(p) == 50 and (p.index >= 100).all()
    assert p.meta["nan_resampled"] > 0
    with pytest.raises(NaNPolicyError, match="NaN/Inf"):
        sp.plan(Sampling(count=150, nan_policy="avoid"), seed=4, read_words=read)
    with pytest.raises(OptionError):
        sp.plan(Sampling(count=1, nan_policy="avoid"), seed=4)


def test_mode_and_option_errors():
    sp = SiteSpace(REFS)
    with pytest.raises(OptionError, match="exactly one"):
        sp.plan(Sampling(count=1, rate=0.1), seed=1)
    with pytest.raises(OptionError):
        sp.plan(Sampling(count=1), seed=-1)
    with pytest.raises(OptionError):
        FaultModel("nonsense")
    with pytest.raises(OptionError):
        SiteSpace([TensorRef("e", "<f4", (0,))])
    assert not hasattr(__import__("fastflip"), "make_plan")  # Sampling.plan / SiteSpace.plan draw plans


def test_merge_of_sorted_plans_with_triples_matches_sequential():
    """The fast path for plans ordered by (tensor, index) composes repeats in plan order."""
    rng = np.random.default_rng(1)
    refs = [TensorRef("u", "<u2", (4,)), TensorRef("v", "<u1", (3,))]
    n = 40
    tensor = np.sort(rng.integers(0, 2, n))
    index = np.where(tensor == 0, rng.integers(0, 4, n), rng.integers(0, 3, n))
    order = np.lexsort((index, tensor))
    tensor, index = tensor[order], index[order]
    and_m = rng.integers(0, 2**16, n, dtype=np.uint64) | np.uint64(0xFFFFFFFFFFFF0000)
    plan = Plan.from_sites(refs, tensor, index, and_mask=and_m, or_mask=rng.integers(0, 2**16, n, dtype=np.uint64) & ~and_m,
                           xor_mask=rng.integers(0, 2**16, n, dtype=np.uint64))
    arrays = {"u": np.array([1, 2, 3, 4], "<u2"), "v": np.array([5, 6, 7], "<u1")}
    seq = {k: v.copy() for k, v in arrays.items()}
    for i in range(n):
        ref = refs[int(plan.tensor[i])]
        j = int(plan.index[i])
        seq[ref.name][j] = word_rule(int(seq[ref.name][j]), int(plan.and_mask[i]), int(plan.or_mask[i]),
                                     int(plan.xor_mask[i]), np.dtype(ref.dtype).itemsize * 8)
    merged = merge_duplicate_elements(plan)
    assert len(merged) == len(set(zip(tensor.tolist(), index.tolist())))
    apply_plan(arrays, merged)
    assert all(arrays[k].tolist() == seq[k].tolist() for k in arrays)


def test_bulk_path_exact_distinct_and_proportional():
    """From sitedraws.BULK sites on, sites are drawn already sorted: still exact, distinct, deterministic, size-proportional."""
    from fastflip.core import sitedraws

    chi2 = require("scipy.stats").chisquare
    refs = [TensorRef("a", "<f4", (50_000,)), TensorRef("b", "<f4", (200_000,)), TensorRef("c", "<i8", (120_000,))]
    sp = SiteSpace(refs, bits="0-7")
    k = sitedraws.BULK + 1000
    p = sp.plan(Sampling(count=k), seed=3)
    keys = p.tensor.astype(np.int64) * 2**40 + p.index
    assert p.meta["flips"] == k and len(np.unique(keys)) == len(p) and int(np.bitwise_count(p.bits).sum()) == k
    assert np.array_equal(p.index, sp.plan(Sampling(count=k), seed=3).index)
    hits = np.bincount(p.tensor, weights=np.bitwise_count(p.bits), minlength=3)
    sizes = np.array([r.size for r in refs], float)
    assert chi2(hits, hits.sum() * sizes / sizes.sum()).pvalue > 1e-3
    q = SiteSpace(refs, bits="0-7").plan(Sampling(ber=k / (sizes.sum() * 8)), seed=3)
    assert abs(q.meta["flips"] - k) < 5 * np.sqrt(k)


def test_plan_takes_a_sampling_that_agrees_with_the_space():
    """SiteSpace.plan takes a Sampling: the space's bits and distribution, the Sampling's amount and model."""
    space = SiteSpace(REFS, bits="exponent")
    named = space.plan(Sampling(bits="exponent", count=30, model="stuck-at-1"), seed=4, stream=(2,))
    unnamed = space.plan(Sampling(count=30, model="stuck-at-1"), seed=4, stream=(2,))
    assert site_keys(named) == site_keys(unnamed) and named.or_mask.tolist() == unnamed.or_mask.tolist()
    with pytest.raises(OptionError, match=r"bits \(sign\) are not the site space's \(exponent\)"):
        space.plan(Sampling(bits="sign", count=1), seed=1)
    with pytest.raises(OptionError, match="distribution"):
        space.plan(Sampling(count=1, distribution="tensor"), seed=1)
    with pytest.raises(TypeError):  # the amount is said by a Sampling only
        space.plan(seed=1, count=1)


class _Reads(Sampling):
    """A Sampling that counts reads of the fields only a check against the space needs."""

    CHECKED = ("bits", "distribution", "rate", "ber")

    def __getattribute__(self, name: str):
        if name in type(self).CHECKED:
            reads = object.__getattribute__(self, "__dict__").setdefault("_reads", {})
            reads[name] = reads.get(name, 0) + 1
        return object.__getattribute__(self, name)


@pytest.mark.parametrize("policy", ["allow", "avoid"])
def test_plan_checks_a_sampling_against_the_space_once(policy):
    """A loop's plans check the Sampling (bits, distribution, rate/ber on a uniform space) on the first call only:
    later calls with the same Sampling read none of those fields, and give the plans a fresh space gives."""
    space = SiteSpace(REFS, bits="exponent")
    read_words = (lambda p: np.zeros(len(p), np.uint64)) if policy == "avoid" else None
    s = _Reads(count=3, nan_policy=policy)
    first = space.plan(s, seed=5, stream=(0,), read_words=read_words)
    after_first = dict(s.__dict__["_reads"])
    plans = [space.plan(s, seed=5, stream=(i,), read_words=read_words) for i in range(1, 6)]
    assert s.__dict__["_reads"] == after_first  # the next five plans re-checked nothing
    fresh = SiteSpace(REFS, bits="exponent")
    for i, p in enumerate([first, *plans]):
        q = fresh.plan(Sampling(count=3, nan_policy=policy), seed=5, stream=(i,), read_words=read_words)
        assert site_keys(p) == site_keys(q) and p.meta == q.meta
    if policy == "avoid":  # read_words is still required on every call
        with pytest.raises(OptionError, match="read_words"):
            space.plan(s, seed=5, stream=(9,))


def test_a_refused_sampling_is_refused_on_every_call():
    """A Sampling the space refuses is not remembered as checked: each call refuses it again, and a good Sampling
    between two calls does not let it through."""
    space = SiteSpace(REFS, distribution="tensor")
    bad, good = Sampling(rate=0.01), Sampling(count=2)
    for _ in range(2):
        with pytest.raises(OptionError, match="rate draws every element"):
            space.plan(bad, seed=1)
        assert len(space.plan(good, seed=1)) == 2
    with pytest.raises(OptionError, match="read_words"):
        space.plan(Sampling(count=2, nan_policy="avoid"), seed=1)
