"""The decoding methods draftboard knows, and every rule about them: the one method table.

Each method has a name (what sweep files, run rows and engine flag files use), a human title,
and the facts the rest of the code asks about (DOMAIN.md "The methods"; MEASUREMENT.md):

| name | title | speculates | drafter | takes k | tree budget | prefix caching |
| --- | --- | --- | --- | --- | --- | --- |
| auto | autoregressive | no | none | no | no | any |
| ngram | n-gram (prompt lookup) | yes | none | yes | no | any |
| draft_model | draft model | yes | required | yes | no | any |
| eagle | EAGLE | yes | required | yes | no | any |
| eagle3 | EAGLE-3 | yes | required | yes | no | any |
| mtp | MTP heads | yes | optional | yes | no | any |
| linear | DFlash (linear) | yes | required | yes | no | any |
| ddtree | DDTree | yes | required | no | required | off |

- k is `num_speculative_tokens`, the draft length per step (tokens); for DFlash it defaults to
  the drafter's `block_size - 1` (the engine flags file says how each engine spells it).
- The tree budget B is DDTree's node budget (root not counted). DDTree's depth comes from its
  DFlash drafter's block, so it takes a budget and no k.
- MTP heads live in the target checkpoint; both engines default their path to the target, so a
  drafter is optional (a path given is still checked by preflight).
- "prefix caching off": tree methods are measured with prefix caching off (MEASUREMENT.md,
  "Reusing a server between points"); forcing it on is an error.

One label format everywhere (sweep files, run rows, charts, exports), in the users' own terms
(DOMAIN.md): `auto`, `linear`, `b15` (DDTree, budget 15), `draft_model k=4`, `ngram k=4`.
`parse_method_token` reads it back, and the file-name tokens of other tools' result files
(`auto`, `linear`, `b15`, a method name, or an alias). `check_method` is the one validation of a
(method, k, budget, drafter, prefix caching) combination; the sweep-file parser, the engine
adapters and the result-file importer all call it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MethodInfo:
    """One row of the method table (see the module docstring).

    `drafter` is "required", "optional" or "none"; `takes_k`: the run may set
    num_speculative_tokens; `needs_budget`: the run must set tree_budget (and only such methods
    take one); `prefix_caching_off`: measured with prefix caching off.
    """

    name: str
    title: str
    speculates: bool
    drafter: Literal["required", "optional", "none"]
    takes_k: bool
    needs_budget: bool = False
    prefix_caching_off: bool = False

    @property
    def needs_drafter(self) -> bool:
        """The run must name a drafter model."""
        return self.drafter == "required"

    @property
    def takes_drafter(self) -> bool:
        """A drafter, when given, is used (and preflight checks its directory)."""
        return self.drafter != "none"


#: The method table, in display order. `auto` (autoregressive) is the baseline every speedup is
#: measured against (benchkit.compare.speedups).
METHODS: dict[str, MethodInfo] = {
    m.name: m
    for m in (
        MethodInfo("auto", "autoregressive", speculates=False, drafter="none", takes_k=False),
        MethodInfo("ngram", "n-gram (prompt lookup)", speculates=True, drafter="none", takes_k=True),
        MethodInfo("draft_model", "draft model", speculates=True, drafter="required", takes_k=True),
        MethodInfo("eagle", "EAGLE", speculates=True, drafter="required", takes_k=True),
        MethodInfo("eagle3", "EAGLE-3", speculates=True, drafter="required", takes_k=True),
        MethodInfo("mtp", "MTP heads", speculates=True, drafter="optional", takes_k=True),
        MethodInfo("linear", "DFlash (linear)", speculates=True, drafter="required", takes_k=True),
        MethodInfo("ddtree", "DDTree", speculates=True, drafter="required", takes_k=False, needs_budget=True,
                   prefix_caching_off=True),
    )
}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)
#: The method names as a type (pydantic models of sweep and flags files use it), built from the table.
MethodName = Literal[METHOD_NAMES]  # type: ignore[valid-type]

#: Aliases `parse_method_token` accepts by default (users' and engines' other names).
DEFAULT_ALIASES: dict[str, str] = {"ar": "auto", "autoregressive": "auto", "dflash": "linear"}


class MethodError(ValueError):
    """A method combination is invalid. `field` is the offending field (`method`,
    `num_speculative_tokens`, `tree_budget`, `drafter` or `prefix_caching`); `reason` says why;
    callers prefix `field` in their own terms (a sweep-file path, `ServerConfig.x`, `--x`)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def method_info(name: str) -> MethodInfo:
    """The table row of `name`. Raises MethodError (field `method`) for an unknown name."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise MethodError("method", f"unknown method {name!r} (known: {', '.join(METHOD_NAMES)})") from None


#: How `check_method` names the fields inside its reasons (callers may pass their own spelling,
#: e.g. command-line options).
FIELD_NAMES: dict[str, str] = {
    "num_speculative_tokens": "num_speculative_tokens",
    "tree_budget": "a tree budget",
    "drafter": "a drafter",
}


def check_method(method: str, k: int | None = None, budget: int | None = None, drafter: str | None = None,
                 prefix_caching: bool | None = None, *, names: Mapping[str, str] = FIELD_NAMES) -> MethodInfo:
    """Check one (method, k, tree budget, drafter, prefix caching) combination against the table and
    return the method's row.

    `k` is num_speculative_tokens (None: the engine's or method's default); `budget` the tree
    budget; `drafter` the drafter path ('': none given; None: not known, e.g. an imported result
    file, and not checked); `prefix_caching` None (engine default), True or False. `names`
    spells the fields inside reasons. Raises MethodError naming the first offending field:
    unknown method; k or a budget on a method that does not speculate; k on a method that takes
    none (DDTree); k or budget not an integer >= 1; a budget missing where needed or given where
    not taken; a required drafter missing; prefix caching forced on for a method measured with
    it off. A drafter given to a method that takes none is not an error (preflight and the
    flags ignore it).
    """
    info = method_info(method)
    for field, value in (("num_speculative_tokens", k), ("tree_budget", budget)):
        if value is None:
            continue
        if not info.speculates:
            raise MethodError(field, f"method {method!r} does not speculate: drop {names[field]}")
        if not isinstance(value, int) or isinstance(value, bool):
            raise MethodError(field, f"expected an integer, got {type(value).__name__} {value!r}")
        if value < 1:
            raise MethodError(field, f"must be >= 1, got {value}")
    if k is not None and not info.takes_k:
        raise MethodError("num_speculative_tokens",
                          f"method {method!r} takes {names['tree_budget']}, not {names['num_speculative_tokens']}")
    takers = " or ".join(repr(m.name) for m in METHODS.values() if m.needs_budget)
    if budget is not None and not info.needs_budget:
        raise MethodError("tree_budget", f"only method {takers} takes {names['tree_budget']}, not {method!r}")
    if budget is None and info.needs_budget:
        raise MethodError("tree_budget", f"method {method!r} needs {names['tree_budget']}")
    if info.needs_drafter and drafter is not None and not drafter:
        raise MethodError("drafter", f"method {method!r} needs {names['drafter']}")
    if prefix_caching is True and info.prefix_caching_off:
        raise MethodError("prefix_caching", f"method {method!r} is measured with prefix caching off (MEASUREMENT.md)")
    return info


def method_label(method: str, k: int | None = None, budget: int | None = None) -> str:
    """The one display label of a decoding configuration: `b15` for DDTree with budget 15, `NAME k=K`
    when k is set and the method takes it (`draft_model k=4`), else the name (`auto`, `linear`).
    An unknown name (an old row) is shown as it is."""
    info = METHODS.get(method)
    if info is None:
        return method
    if info.needs_budget and budget:
        return f"b{budget}"
    if info.takes_k and k:
        return f"{method} k={k}"
    return method


#: Display order of the methods: autoregressive first, then the DFlash family the users compare
#: (linear, DDTree by budget), then the others in the table's order.
_DISPLAY_RANK = {m: i for i, m in enumerate(("auto", "linear", "ddtree",
                                             *(m for m in METHOD_NAMES if m not in ("auto", "linear", "ddtree"))))}


def config_order(method: str, k: int | None = None, budget: int | None = None, drafter: str = "") -> tuple:
    """Sort key of a decoding configuration for display (rows, legends): auto, linear, DDTree by
    budget, then the other methods in the table's order, each by k, then drafter; an unknown
    method after all known ones."""
    return (_DISPLAY_RANK.get(method, len(_DISPLAY_RANK)), method, budget or 0, k or 0, drafter or "")


def method_title(method: str) -> str:
    """Human title of a method (`DFlash (linear)`, `DDTree`); the name itself when unknown."""
    info = METHODS.get(method)
    return info.title if info else method


@dataclass(frozen=True)
class MethodChoice:
    """A decoding configuration read from a token: method name, k and tree budget (None: unset)."""

    method: str
    num_speculative_tokens: int | None = None
    tree_budget: int | None = None

    @property
    def label(self) -> str:
        """`method_label` of this choice."""
        return method_label(self.method, self.num_speculative_tokens, self.tree_budget)


_BUDGET_TOKEN = re.compile(r"b(\d+)")
_LABEL_TOKEN = re.compile(r"([a-z0-9_]+)(?: k=(\d+))?")


def parse_method_token(token: str, aliases: Mapping[str, str] | None = None) -> MethodChoice:
    """Read a decoding configuration from a file-name token or a label (case-insensitive).

    Accepts `bNN` (DDTree, budget NN: the users' `b15`), a method name (`auto`, `linear`,
    `ngram`, ...), a label `NAME k=K` (the inverse of `method_label`), or an alias: `aliases`
    (token -> any accepted token, e.g. {"tree15": "b15"}) on top of DEFAULT_ALIASES. The result
    passes `check_method` (a token names no drafter, so that is not checked). Raises MethodError
    (field `method`) naming the token and what is accepted.
    """
    table = {**DEFAULT_ALIASES, **{a.lower(): v for a, v in (aliases or {}).items()}}
    text = token.strip().lower()
    text = table.get(text, text).lower()
    budget = _BUDGET_TOKEN.fullmatch(text)
    label = _LABEL_TOKEN.fullmatch(text)
    if budget:
        choice = MethodChoice("ddtree", tree_budget=int(budget.group(1)))
    elif label and label.group(1) in METHODS:
        choice = MethodChoice(label.group(1), int(label.group(2)) if label.group(2) else None)
    else:
        raise MethodError("method", f"unknown method token {token!r} (known: {', '.join(METHOD_NAMES)}, bNN for "
                                    f"DDTree budget NN, 'NAME k=K', aliases {', '.join(sorted(table))})")
    try:
        check_method(choice.method, choice.num_speculative_tokens, choice.tree_budget)
    except MethodError as exc:
        raise MethodError("method", f"token {token!r}: {exc.reason}") from None
    return choice
