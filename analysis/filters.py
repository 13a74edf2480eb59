"""Every page's query string, read in one place so that a view can be linked and a bad value gets
one answer: `QueryError(param, reason)`, which the views answer with HTTP 400 and the text
`bad query: <param>: <reason>` (analysis.views.bad_query).

The sweep page's selection (`parse_selection`):
`?tp=1&tp=4&concurrency=1&output_len=1024&method=ddtree&method=linear&host=gpu-a&baseline=linear&speedup=e2e`:
each of tp, concurrency, output_len, method and host (a sweep on several hosts) may repeat (or
hold comma-separated values); absent means all. A `method` value is a method name (`ddtree`:
every budget) or a configuration label (`b15`, `draft_model k=4`, `auto`;
benchkit.methods.parse_method_token). `baseline` is the label of the configuration speedups
divide by (default `auto`). `speedup` picks the speedup the heatmap and headline use
(benchkit.compare.verdicts.SPEEDUP_CHOICES: `decode`, `e2e`, or `auto`, the default: decode at
concurrency 1, end-to-end above it).

The history pages (`parse_history_filters`, `sweep_id`, `whole_number`): the point filters
(benchkit.point.FILTER_FIELDS: `tp=1,4&concurrency=8&method=ddtree`), sweep ids
(`?old=ID&new=ID`), counts (`nights=30`); `choice` for a value out of a fixed set (`state`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from benchkit.compare.speedups import AUTO
from benchkit.compare.verdicts import AUTO_CHOICE, SPEEDUP_CHOICES
from benchkit.hosts import HOST_NAME_RE
from benchkit.methods import METHOD_NAMES, MethodError, method_label, parse_method_token
from benchkit.point import FILTER_FIELDS, Point

#: Query parameters of the selection, in the order a link writes them.
PARAMS = ("tp", "concurrency", "output_len", "method", "host", "baseline", "speedup")


class QueryError(ValueError):
    """A query parameter of a page is invalid; `param` names it, the message says why."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class Selection:
    """What the sweep page shows: TP degrees, concurrency levels, output lengths (each empty:
    all), methods (names or labels as given; empty: all) and the baseline label."""

    tp: tuple[int, ...] = ()
    concurrency: tuple[int, ...] = ()
    output_len: tuple[int, ...] = ()
    method: tuple[str, ...] = ()
    #: host names (a sweep on several hosts); empty: all
    host: tuple[str, ...] = ()
    baseline: str = AUTO
    #: which speedup the heatmap and headline use (benchkit.compare.verdicts.SPEEDUP_CHOICES)
    speedup: str = AUTO_CHOICE
    #: `method` split into method names and (method, k, budget) configurations.
    names: tuple[str, ...] = field(default=(), compare=False)
    configs: tuple[tuple[str, int | None, int | None], ...] = field(default=(), compare=False)

    def shows(self, p: Point) -> bool:
        """True when point `p` passes the method filter (the other filters are applied in SQL)."""
        if not self.method:
            return True
        return p.method in self.names or (p.method, p.num_speculative_tokens, p.tree_budget) in self.configs

    def load_kwargs(self, baseline_config: tuple[str, int | None, int | None] | None) -> dict[str, Any]:
        """Keyword filters for runs.selectors.figure_points: every filter, with the method filter
        widened to the baseline's configuration and `auto` (speedups and step costs need them
        even when the page does not show them)."""
        kw: dict[str, Any] = {"tp": self.tp, "concurrency": self.concurrency, "output_len": self.output_len,
                              "host": self.host}
        if self.method:
            configs = set(self.configs)
            if baseline_config:
                configs.add(baseline_config)
            kw.update(methods=tuple(set(self.names) | {AUTO}), configs=tuple(sorted(configs, key=str)))
        return kw

    def query(self, **change: Any) -> str:
        """This selection as a URL query string (`?tp=1&...`, '' when it selects everything),
        with the fields in `change` replaced."""
        values = {name: getattr(self, name) for name in PARAMS} | change
        pairs = [(name, v) for name in PARAMS if name not in ("baseline", "speedup") for v in values[name]]
        if values["baseline"] != AUTO:
            pairs.append(("baseline", values["baseline"]))
        if values["speedup"] != AUTO_CHOICE:
            pairs.append(("speedup", values["speedup"]))
        return "?" + urlencode(pairs) if pairs else ""

    @property
    def is_filtered(self) -> bool:
        """True when any filter (not the baseline) narrows the sweep."""
        return bool(self.tp or self.concurrency or self.output_len or self.method or self.host)


def _values(query: Mapping[str, Any], name: str) -> list[str]:
    raw = query.getlist(name) if hasattr(query, "getlist") else _as_list(query.get(name))
    return [v.strip() for item in raw for v in str(item).split(",") if v.strip()]


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


#: The largest grid value a filter accepts (PostgreSQL's `integer`, the columns' type) and the
#: largest id (`bigint`): a larger number matches nothing and would overflow the query.
MAX_VALUE = 2**31 - 1
MAX_ID = 2**63 - 1
_WHOLE = re.compile(r"[+-]?[0-9]{1,19}")


def _whole(raw: str, name: str, what: str) -> int:
    """`raw` as an integer, written in ASCII digits with an optional sign, at most 19 of them
    (`int()` alone also reads '1_0' as 10 and Arabic-Indic digits, and `str.isdigit()` passes
    '²', which `int()` refuses). Raises QueryError naming `name` otherwise."""
    if not _WHOLE.fullmatch(raw):
        raise QueryError(name, f"expected {what}, got {raw[:100]!r}")
    return int(raw)


def _ints(query: Mapping[str, Any], name: str, minimum: int) -> tuple[int, ...]:
    out = []
    for v in _values(query, name):
        n = _whole(v, name, "whole numbers")
        if n < minimum:
            raise QueryError(name, f"must be >= {minimum}, got {n}")
        if n > MAX_VALUE:
            raise QueryError(name, f"must be <= {MAX_VALUE}, got {n}")
        out.append(n)
    return tuple(sorted(set(out)))


def parse_selection(query: Mapping[str, Any]) -> Selection:
    """Read a Selection from a URL query (a Django QueryDict or a plain mapping). Raises
    QueryError naming the parameter for a value that is not a number or not a method."""
    names, configs, methods = [], [], []
    for v in _values(query, "method"):
        if v in METHOD_NAMES:
            names.append(v)
        else:
            try:
                choice = parse_method_token(v)
            except MethodError as exc:
                raise QueryError("method", exc.reason) from None
            configs.append((choice.method, choice.num_speculative_tokens, choice.tree_budget))
        methods.append(v)
    baseline = (_values(query, "baseline") or [AUTO])[0]
    if baseline != AUTO:
        try:
            choice = parse_method_token(baseline)
        except MethodError as exc:
            raise QueryError("baseline", exc.reason) from None
        baseline = method_label(choice.method, choice.num_speculative_tokens, choice.tree_budget)
    speedup = (_values(query, "speedup") or [AUTO_CHOICE])[0]
    if speedup not in SPEEDUP_CHOICES:
        raise QueryError("speedup", f"{speedup[:40]!r} is not one of {', '.join(SPEEDUP_CHOICES)}")
    hosts = _values(query, "host")
    for h in hosts:
        if not HOST_NAME_RE.match(h):
            raise QueryError("host", f"{h[:100]!r} is not a host name")
    # concurrency and output length may be 0: an imported result file that did not record them
    return Selection(tp=_ints(query, "tp", 1), concurrency=_ints(query, "concurrency", 0),
                     output_len=_ints(query, "output_len", 0), method=tuple(dict.fromkeys(methods)),
                     host=tuple(sorted(set(hosts))), baseline=baseline, speedup=speedup, names=tuple(names),
                     configs=tuple(configs))


def parse_history_filters(query: Mapping[str, Any]) -> dict[str, list]:
    """The point filters of a history page (benchkit.point.FILTER_FIELDS), each a list of the
    values given (`tp=1,4&method=ddtree`): whole numbers >= 0 but for `method` (method names);
    an absent filter is left out. Raises QueryError naming a value that is not a whole number or
    not a method name."""
    out: dict[str, list] = {}
    for name in FILTER_FIELDS:
        if name == "method":
            values: list = _values(query, name)
            unknown = [v for v in values if v not in METHOD_NAMES]
            if unknown:  # as the sweep page refuses it: a typo would show an empty page
                raise QueryError("method", f"unknown method {unknown[0][:40]!r} (known: {', '.join(METHOD_NAMES)})")
        else:
            values = list(_ints(query, name, 0))
        if values:
            out[name] = values
    return out


def sweep_id(query: Mapping[str, Any], name: str) -> int | None:
    """The sweep id given as `name` (None when absent). Raises QueryError for one that is not a
    whole number."""
    raw = (_values(query, name) or [""])[0]
    if not raw:
        return None
    n = _whole(raw, name, "a sweep id")
    if not 1 <= n <= MAX_ID:
        raise QueryError(name, f"{raw[:100]!r}: expected a sweep id")
    return n


def whole_number(query: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    """The whole number given as `name`, `default` when absent. Raises QueryError for one that is
    not a whole number in [low, high]."""
    raw = (_values(query, name) or [None])[0]
    if raw is None:
        return default
    n = _whole(raw, name, "a whole number")
    if not low <= n <= high:
        raise QueryError(name, f"expected {low}..{high}, got {n}")
    return n


def choice(query: Mapping[str, Any], name: str, choices: Sequence[str]) -> str:
    """The value given as `name` ("" when absent), one of `choices`. Raises QueryError otherwise."""
    raw = (_values(query, name) or [""])[0]
    if raw and raw not in choices:
        raise QueryError(name, f"{raw[:100]!r} (one of {', '.join(choices)})")
    return raw
