"""The method table (benchkit.methods): one label format, the token parser, and one validation
that the sweep parser, the engine adapters and the importer all apply."""

from __future__ import annotations

import pytest

from benchkit.engines.adapters import adapter_for
from benchkit.engines.flags import EngineConfigError
from benchkit.methods import (
    METHOD_NAMES,
    METHODS,
    MethodChoice,
    MethodError,
    check_method,
    method_label,
    parse_method_token,
)
from benchkit.specs import ServerConfig
from benchkit.sweeps.sweepfile import SweepError, parse_sweep


def test_table_rows_match_domain():
    assert METHOD_NAMES == ("auto", "ngram", "draft_model", "eagle", "eagle3", "mtp", "linear", "ddtree")
    assert [m for m in METHOD_NAMES if not METHODS[m].speculates] == ["auto"]
    assert [m for m in METHOD_NAMES if METHODS[m].needs_drafter] == ["draft_model", "eagle", "eagle3", "linear",
                                                                      "ddtree"]
    assert [m for m in METHOD_NAMES if not METHODS[m].takes_drafter] == ["auto", "ngram"]
    assert [m for m in METHOD_NAMES if METHODS[m].needs_budget] == ["ddtree"]
    assert [m for m in METHOD_NAMES if METHODS[m].prefix_caching_off] == ["ddtree"]
    assert METHODS["linear"].title == "DFlash (linear)"


@pytest.mark.parametrize(("method", "k", "budget", "label"), [
    ("auto", None, None, "auto"),
    ("linear", None, None, "linear"),
    ("linear", 15, None, "linear k=15"),
    ("ddtree", None, 15, "b15"),
    ("ddtree", None, 64, "b64"),
    ("draft_model", 4, None, "draft_model k=4"),
    ("ngram", None, None, "ngram"),
    ("old_method", 3, None, "old_method"),  # an unknown name on an old row is shown as it is
])
def test_one_label_format(method, k, budget, label):
    assert method_label(method, k, budget) == label


@pytest.mark.parametrize(("token", "choice"), [
    ("auto", MethodChoice("auto")),
    ("linear", MethodChoice("linear")),
    ("b15", MethodChoice("ddtree", tree_budget=15)),
    ("B64", MethodChoice("ddtree", tree_budget=64)),
    ("eagle3", MethodChoice("eagle3")),
    ("draft_model k=4", MethodChoice("draft_model", 4)),
    ("dflash", MethodChoice("linear")),
    ("ar", MethodChoice("auto")),
])
def test_parse_method_token(token, choice):
    assert parse_method_token(token) == choice


def test_parse_reads_every_label_back_and_takes_aliases():
    for method, k, budget in [("auto", None, None), ("linear", 15, None), ("ddtree", None, 32),
                              ("ngram", 4, None), ("mtp", 1, None)]:
        label = method_label(method, k, budget)
        assert parse_method_token(label) == MethodChoice(method, k, budget)
    assert parse_method_token("tree15", aliases={"tree15": "b15"}) == MethodChoice("ddtree", tree_budget=15)
    assert parse_method_token("baseline", aliases={"Baseline": "auto"}).label == "auto"


@pytest.mark.parametrize(("token", "needle"), [
    ("beam", "unknown method token 'beam'"),
    ("ddtree", "needs a tree budget"),
    ("b0", "must be >= 1"),
    ("auto k=3", "does not speculate"),
    ("", "unknown method token ''"),
])
def test_parse_rejects_bad_tokens(token, needle):
    with pytest.raises(MethodError, match=needle) as err:
        parse_method_token(token)
    assert err.value.field == "method"


@pytest.mark.parametrize(("kw", "field", "needle"), [
    ({"method": "beam"}, "method", "unknown method 'beam'"),
    ({"method": "ddtree", "drafter": "/d"}, "tree_budget", "method 'ddtree' needs a tree budget"),
    ({"method": "linear", "budget": 15, "drafter": "/d"}, "tree_budget", "only method 'ddtree' takes a tree budget"),
    ({"method": "auto", "budget": 15}, "tree_budget", "method 'auto' does not speculate"),
    ({"method": "auto", "k": 2}, "num_speculative_tokens", "does not speculate"),
    ({"method": "ddtree", "k": 4, "budget": 15, "drafter": "/d"}, "num_speculative_tokens",
     "takes a tree budget, not num_speculative_tokens"),
    ({"method": "ngram", "k": 0}, "num_speculative_tokens", "must be >= 1, got 0"),
    ({"method": "ngram", "k": True}, "num_speculative_tokens", "expected an integer"),
    ({"method": "eagle3", "drafter": ""}, "drafter", "method 'eagle3' needs a drafter"),
    ({"method": "ddtree", "budget": 15, "drafter": "/d", "prefix_caching": True}, "prefix_caching",
     "prefix caching off"),
])
def test_check_method_names_the_field(kw, field, needle):
    with pytest.raises(MethodError, match=needle) as err:
        check_method(kw.pop("method"), **kw)
    assert err.value.field == field


def test_check_method_accepts_valid_and_unchecked_drafter():
    assert check_method("ddtree", None, 15, "/d", False).name == "ddtree"
    assert check_method("linear", drafter=None).name == "linear"  # None: drafter not known (imports)
    assert check_method("auto", drafter="/d").name == "auto"  # an unused drafter is ignored
    assert check_method("mtp", 1, drafter="").name == "mtp"  # optional
    spelled = {"num_speculative_tokens": "--k", "tree_budget": "--budget", "drafter": "--drafter"}
    with pytest.raises(MethodError, match="method 'ddtree' needs --budget"):
        check_method("ddtree", names=spelled)


def test_sweep_adapter_and_import_apply_the_same_rule():
    """DDTree with k: each consumer refuses it through check_method, in its own terms."""
    with pytest.raises(SweepError, match=r"grid.methods\[0\].num_speculative_tokens: method 'ddtree' takes"):
        parse_sweep({"name": "t", "engine": "sglang", "model": "/m", "drafter": "/d",
                     "grid": {"methods": [{"method": "ddtree", "tree_budget": 15, "num_speculative_tokens": 3,
                                           "engine_build": "sglang-ddtree-pr"}]}}, "x.yaml")
    server = ServerConfig(engine="sglang", model="/m", drafter="/d", method="ddtree", tree_budget=15,
                          num_speculative_tokens=3, engine_build="sglang-ddtree-pr")
    with pytest.raises(EngineConfigError, match="ServerConfig.num_speculative_tokens: method 'ddtree' takes"):
        adapter_for("sglang").build_argv(server, 30000, python="py")

