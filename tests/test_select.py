"""Tensor selection by glob, regex, dtype, role and layer."""

from __future__ import annotations

import fnmatch

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import h5fixtures as hf
from fastflip.errors import OptionError, SelectionError
from fastflip.files.layout import read_layout
from fastflip.files.select import Selection, dtype_matcher, glob_to_regex, select


@pytest.fixture
def torch_layout(tmp_path):
    p = tmp_path / "t.h5"
    hf.torch_like(p)
    return read_layout(p)


def paths(ts):
    return [t.path for t in ts]


def test_everything_and_order(torch_layout):
    ts = torch_layout.tensors
    assert paths(select(ts)) == paths(ts)
    assert paths(select(ts, Selection())) == paths(ts)
    sub = select(list(reversed(ts)), Selection(include=("model/*",)))
    assert paths(sub) == [p for p in reversed(paths(ts)) if p.startswith("/model/")]  # input order kept


def test_globs(torch_layout):
    ts = torch_layout.tensors
    assert paths(select(ts, Selection(include=("/model/conv1.*",)))) == ["/model/conv1.bias", "/model/conv1.weight"]
    assert paths(select(ts, Selection(include=("model/conv1.*",)))) == ["/model/conv1.bias", "/model/conv1.weight"]
    # fnmatch semantics: '*' crosses '/', as does '**'
    assert len(select(ts, Selection(include=("optimizer/*",)))) == 7
    assert paths(select(ts, Selection(include=("*running*",)))) == ["/model/bn1.running_mean",
                                                                      "/model/bn1.running_var"]
    got = paths(select(ts, Selection(include=("optimizer/**",))))
    assert got == [p for p in paths(ts) if p.startswith("/optimizer/")] and len(got) == 7
    assert paths(select(ts, Selection(include=("**/exp_avg",)))) == ["/optimizer/state/0/exp_avg",
                                                                     "/optimizer/state/1/exp_avg"]
    assert paths(select(ts, Selection(include=("/optimizer/**/step",)))) == ["/optimizer/state/0/step",
                                                                             "/optimizer/state/1/step"]
    ex = select(ts, Selection(include=("model/*",), exclude=("*bias", "**running*")))
    assert all(not p.endswith("bias") and "running" not in p for p in paths(ex)) and len(ex) == 4


def test_regex_and_aliases(tmp_path):
    p = str(tmp_path / "z.h5")
    hf.storage_zoo(p)
    ts = read_layout(p).tensors
    # /weights/kernel is an alias of /links/soft: matching the alias selects the tensor once
    assert paths(select(ts, Selection(include=("/weights/*",)))) == ["/links/soft"]
    assert paths(select(ts, Selection(include=("hard_alias",)))) == ["/contig"]
    assert paths(select(ts, Selection(regex=(r"_be$",)))) == ["/chunked_be", "/contig_be"]
    both = select(ts, Selection(include=("gzip",), regex=(r"^/lzf$",)))
    assert paths(both) == ["/gzip", "/lzf"]
    # exclude also looks at aliases
    assert "/contig" not in paths(select(ts, Selection(exclude=("hard_alias",))))


def test_dtypes(tmp_path):
    p = str(tmp_path / "zoo.h5")
    hf.dtype_zoo(p)
    ts = read_layout(p).tensors
    assert paths(select(ts, Selection(dtypes=("float32",)))) == ["/f4_be", "/f4_le"]
    assert paths(select(ts, Selection(dtypes=("f4",)))) == ["/f4_be", "/f4_le"]
    assert paths(select(ts, Selection(dtypes=(">f4",)))) == ["/f4_be"]
    assert paths(select(ts, Selection(dtypes=("<f4",)))) == ["/f4_le"]
    assert len(select(ts, Selection(dtypes=("float",)))) == 6
    assert len(select(ts, Selection(dtypes=("int",)))) == 14
    assert len(select(ts, Selection(dtypes=("uint",)))) == 7
    assert paths(select(ts, Selection(dtypes=("bool",)))) == ["/bool"]
    assert paths(select(ts, Selection(dtypes=("i1", "u1")))) == ["/i1", "/u1"]
    with pytest.raises(OptionError, match="unknown dtype"):
        Selection(dtypes=("floaty",))


def test_roles_and_layers(torch_layout):
    ts = torch_layout.tensors
    assert paths(select(ts, Selection(roles=("bn-statistic",)))) == ["/model/bn1.running_mean",
                                                                      "/model/bn1.running_var"]
    assert len(select(ts, Selection(roles=("step-counter",)))) == 3
    assert paths(select(ts, Selection(layers=("bn*",), roles=("weight", "bias")))) == ["/model/bn1.bias",
                                                                                       "/model/bn1.weight"]
    assert paths(select(ts, Selection(layers=("layer1.*",)))) == ["/model/layer1.0.fc.bias",
                                                                  "/model/layer1.0.fc.weight"]
    with pytest.raises(OptionError, match="unknown role"):
        Selection(roles=("weightz",))


def test_nothing_selected_names_what_exists(torch_layout):
    with pytest.raises(SelectionError) as ei:
        select(torch_layout.tensors, Selection(include=("nothing*",), dtypes=("f2",)))
    msg = str(ei.value)
    assert "nothing*" in msg and "/model/bn1.bias" in msg and "<f4" in msg and "bn-statistic" in msg
    assert "\n" not in msg
    with pytest.raises(LookupError):
        select([], None)


def test_from_dict_and_strings():
    s = Selection.from_dict({"include": "model/*", "roles": ["weight"]})
    assert s.include == ("model/*",) and s.roles == ("weight",)
    assert s.describe() == "include=model/* roles=weight"
    with pytest.raises(OptionError):
        Selection.from_dict({"paths": ["x"]})
    with pytest.raises(OptionError, match="regular expression"):
        Selection(regex=("(",))


def test_dtype_matcher_native_and_swapped():
    m = dtype_matcher("int16")
    assert m(np.dtype("<i2")) and m(np.dtype(">i2")) and not m(np.dtype("<u2"))


# property: for patterns without '/**/', our glob is fnmatch on the '/'-prefixed path
_comp = st.text(alphabet="ab.c_0[]!", min_size=1, max_size=4)
_pat_comp = st.text(alphabet="ab.c_0*?[]!", min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(_comp, min_size=1, max_size=3), st.lists(_pat_comp, min_size=1, max_size=3))
def test_glob_agrees_with_fnmatch_per_component(path_parts, pat_parts):
    path = "/" + "/".join(path_parts)
    pattern = "/".join(pat_parts)
    assume("/**/" not in "/" + pattern + "/")
    want = fnmatch.fnmatchcase(path, "/" + pattern)
    assert bool(glob_to_regex(pattern).match(path)) == want


def test_double_star_zero_components():
    assert glob_to_regex("a/**/b").match("/a/b") and glob_to_regex("a/**/b").match("/a/x/y/b")
    assert not glob_to_regex("a/**/b").match("/ab")


def test_role_short_names():
    assert Selection(roles=("optimizer", "bn", "counter")).roles == ("optimizer-moment", "bn-statistic", "step-counter")
