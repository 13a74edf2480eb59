"""Verdicts (issue 18; benchkit/compare/verdicts.py, docs/VERDICTS.md): which points may feed a
verdict, decode vs end-to-end speedup, and winners named only beyond noise; then the issue's own
shape (a demo sweep whose ngram k=4 point has a median TPOT of 0 and a client_saturated mark) through
the sweep page's builders: no figure or sentence uses the excluded point, and the decomposition's
decode speedup is the heatmap's for every stored point."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from django.urls import reverse

from analysis import dashboard, figures
from analysis.filters import Selection, parse_selection
from benchkit.compare import lossless as ll
from benchkit.compare import verdicts
from benchkit.compare.speedups import DECODE, END_TO_END, compute_speedups, relative_step_costs
from benchkit.measure.metrics import WindowMetrics
from benchkit.point import Point
from tests.usersgrid import make_users_grid


def point(run_id, method="auto", k=None, tps=100.0, tpot=10.0, ttft=50.0, tau=None, conc=1, repeat=0,
          window=10.0, completed=16, marks=(), verdict=""):
    return Point(run_id=run_id, engine="vllm", engine_version="0.32", model="/m", tp=1, input_len=128,
                 output_len=128, concurrency=conc, method=method, num_speculative_tokens=k, repeat_index=repeat,
                 suspect_reasons=tuple(marks), lossless_verdict=verdict,
                 lossless_sentence="differs beyond the AR noise floor (25 % of requests)" if verdict else "",
                 figures_={**WindowMetrics().to_dict(), "output_throughput_tok_s": tps, "median_tpot_ms": tpot,
                           "median_ttft_ms": ttft, "acceptance_length": tau, "mean_tokens_per_chunk": tau,
                           "duration_s": window, "completed": completed})


# --- the pure rules -------------------------------------------------------------------------------


def test_each_degenerate_rule_excludes_with_its_reason():
    assert verdicts.exclusion_reason(point(1)) == ""
    assert "median TPOT 0 ms" in verdicts.exclusion_reason(point(1, tpot=0.0))
    assert verdicts.exclusion_reason(point(1, window=verdicts.MIN_WINDOW_S * 0.9)).startswith("window ")
    few = point(1, completed=verdicts.MIN_COMPLETED_REQUESTS - 1)
    assert "fewer than the minimum" in verdicts.exclusion_reason(few)
    for code in ("client_saturated", "client_stalled", "telemetry_gap"):
        assert code in verdicts.exclusion_reason(point(1, marks=[f"{code}: the client was busy"]))
    # a mark that does not touch timing, and unknown figures (an imported file), exclude nothing
    assert verdicts.exclusion_reason(point(1, marks=["suspect: tau disagrees"], tpot=None, window=None,
                                           completed=None)) == ""
    unloaded = Point(run_id=9, figures_={"output_throughput_tok_s": 1.0})
    assert verdicts.exclusion_reason(unloaded) == ""
    two = verdicts.exclusion_reason(point(1, tpot=0.0, marks=["client_saturated: lag p99 40 ms"]))
    assert "median TPOT 0 ms" in two and "client_saturated" in two and "; " in two


def test_the_speedup_choice_defaults_to_decode_at_one_and_end_to_end_above():
    assert verdicts.figure_for("auto", 1) is DECODE and verdicts.figure_for("auto", None) is DECODE
    assert verdicts.figure_for("auto", 4) is END_TO_END
    assert verdicts.figure_for("decode", 64) is DECODE and verdicts.figure_for("e2e", 1) is END_TO_END
    with pytest.raises(ValueError, match="unknown speedup choice"):
        verdicts.figure_for("fastest", 1)


def _cell(points):
    return compute_speedups(points, figures=(END_TO_END, DECODE))


def test_winner_only_when_its_interval_is_separated_from_the_runner_up():
    pts = [point(i, tps=100 + i, tpot=10.0 - 0.1 * i, repeat=i) for i in range(3)]
    pts += [point(10 + i, "ngram", 4, tps=300 + i, tpot=4.0 - 0.01 * i, repeat=i) for i in range(3)]
    pts += [point(20 + i, "draft_model", 2, tps=200 + i, tpot=6.0 - 0.01 * i, repeat=i) for i in range(3)]
    v = verdicts.verdict(_cell(pts), END_TO_END)
    assert v.kind == verdicts.WINNER and v.winner.label == "ngram k=4" and not v.greyed
    assert v.sentence.startswith("ngram k=4 is fastest: end-to-end speedup 2.98× (95% CI")
    assert [c.label for c in v.ranking] == ["ngram k=4", "draft_model k=2", "auto"]


def test_overlapping_intervals_tie_within_noise():
    pts = [point(i, tps=t, repeat=i) for i, t in enumerate((100, 95, 105))]
    pts += [point(10 + i, "draft_model", 2, tps=t, repeat=i) for i, t in enumerate((200, 230, 170))]
    pts += [point(20 + i, "draft_model", 4, tps=t, repeat=i) for i, t in enumerate((210, 180, 240))]
    v = verdicts.verdict(_cell(pts), END_TO_END)
    assert v.kind == verdicts.TIE and v.winner is None
    assert {c.label for c in v.tied} == {"draft_model k=2", "draft_model k=4"}
    assert v.sentence.startswith("draft_model k=4 and draft_model k=2 tie within noise")


def test_single_runs_give_no_verdict_and_a_greyed_ranking():
    pts = [point(1, tps=100), point(2, "ngram", 4, tps=300), point(3, "draft_model", 2, tps=200)]
    v = verdicts.verdict(_cell(pts), END_TO_END)
    assert (v.kind, v.sentence, v.greyed, v.winner) == (verdicts.SINGLE, "single runs: no verdict", True, None)
    assert v.top.label == "ngram k=4"
    two = [point(i, tps=100, repeat=i) for i in range(2)] + [point(5 + i, "ngram", 4, tps=300, repeat=i)
                                                             for i in range(2)]
    assert verdicts.verdict(_cell(two), END_TO_END).sentence == "fewer than 3 repeats: no verdict"
    assert verdicts.verdict(_cell([point(1)]), END_TO_END).kind == verdicts.NONE
    # issue 31: "an end-to-end speedup" (was "a end-to-end speedup")
    assert (verdicts.verdict(_cell([point(1)]), END_TO_END).sentence
            == "nothing to compare: only auto has an end-to-end speedup")


def test_a_winner_that_is_not_lossless_keeps_its_mark_in_the_sentence():
    pts = [point(i, tps=100, repeat=i) for i in range(3)]
    pts += [point(10 + i, "ngram", 4, tps=300 + i, repeat=i, verdict=ll.BEYOND_FLOOR) for i in range(3)]
    by_run = {p.run_id: p for p in pts}
    v = verdicts.verdict(_cell(pts), END_TO_END, by_run)
    assert v.winner.label == "ngram k=4" and v.winner.mark is not None
    assert f"; {ll.MARK} not lossless: differs beyond the AR noise floor" in v.sentence


def test_ttft_moved_where_decode_and_end_to_end_differ_by_more_than_ten_percent():
    # the issue's draft_model k=2: TPOT 0.608 ms (auto) vs 1.002 ms, TTFT 138 ms vs 21 ms
    (sp,) = [s for s in _cell([point(1, tps=100, tpot=0.608, ttft=138), point(2, "draft_model", 2, tps=145,
                                                                             tpot=1.002, ttft=21)])
             if s.label != "auto"]
    note = verdicts.ttft_note(sp, 21, 138)
    assert note.startswith("decode 0.61× vs end-to-end 1.45×: TTFT moved (median TTFT 21 ms vs 138 ms for auto)")
    (close,) = [s for s in _cell([point(1, tps=100, tpot=10), point(2, "ngram", 2, tps=105, tpot=10 / 1.1)])
                if s.label != "auto"]
    assert verdicts.ttft_note(close) == ""  # 1.05 vs 1.10: within DIFFER_SHARE


# --- the issue's shape through the sweep page's builders -----------------------------------------------


def issue_shape():
    """The issue's demo sweep at concurrency 1 (figures from the issue): auto TPOT 0.608 ms and TTFT 138 ms;
    draft_model k=2 TPOT 1.002 ms, TTFT 21 ms, tau 3; draft_model k=4; ngram k=4 with median TPOT 0 and
    marked client_saturated (the headline's "2.67x" before this change)."""
    return [point(1, tps=100.0, tpot=0.608, ttft=138.0),
            point(2, "draft_model", 2, tps=145.0, tpot=1.002, ttft=21.0, tau=3.0),
            point(3, "draft_model", 4, tps=150.0, tpot=0.9, ttft=21.0, tau=5.0),
            point(4, "ngram", 4, tps=267.0, tpot=0.0, ttft=40.0, tau=5.0,
                  marks=["client_saturated: over the window the load client (1 process) used 97 % of a core"])]


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _strings(v)


def test_no_figure_or_sentence_uses_the_excluded_ngram_point():
    pts = issue_shape()
    sel = Selection()
    figs, speedups = dashboard.sweep_figures(pts, sel)
    assert all("ngram" not in sp.label for sp in speedups)  # never divided, never ranked
    heat = figs["speedup"]
    (trace,) = heat["data"]
    r, c = trace["y"].index("ngram k=4"), 0
    assert trace["z"][r][c] is None and trace["text"][r][c] == "excluded"
    assert "median TPOT 0 ms" in trace["hovertext"][r][c] and "client_saturated" in trace["hovertext"][r][c]
    hollow = [s for s in heat["layout"]["shapes"] if s["line"].get("dash") == "dot"]
    assert len(hollow) == 1 and hollow[0]["y0"] < r < hollow[0]["y1"]
    assert not any(t.startswith("★") for row in trace["text"] for t in row)  # single runs: no winner
    dec = figs["decomposition"]
    assert all("ngram" not in x for t in dec["data"] for x in t.get("x", []))
    said, _, excluded_part = dec["caption"].partition(" Excluded (never drawn): ")
    assert "ngram" not in said and excluded_part.startswith("ngram k=4 TP1 c1 run 4: median TPOT 0 ms")
    # the panel's sentence: draft_model k=4 accepts the most; single runs name no fastest (the verdict rule)
    assert "draft_model k=4 accepts the most (τ 5.00); by the decode speedup, single runs: no verdict." in said
    page = dashboard.build_sweep_page(pts, [], sel, [], {})
    head = page["headline"]
    (row,) = head["rows"]
    (cell,) = row["cells"]
    assert cell.kind == verdicts.SINGLE and cell.figure is DECODE
    assert [c.label for c in cell.ranking] == ["auto", "draft_model k=4", "draft_model k=2"]  # speculation slower
    assert all(f["label"] != "ngram k=4" for f in head["fastest"])
    assert page["excluded_line"].startswith("Excluded from verdicts and the decomposition (drawn hollow): 1 run — "
                                            "run 4 (ngram k=4, TP1, concurrency 1): median TPOT 0 ms")
    for name, fig in figs.items():  # the ngram run's id appears only where it is named as excluded
        for s in _strings(fig):
            if "run 4" in s or "ngram" in s:
                assert "excluded" in s.lower() or s == "ngram k=4", (name, s)


def test_the_heatmap_cell_says_ttft_moved():
    figs, _ = dashboard.sweep_figures(issue_shape(), Selection())
    (trace,) = figs["speedup"]["data"]
    r = trace["y"].index("draft_model k=2")
    assert trace["text"][r][0] == "0.61×<br>single run<br>TTFT moved"
    moved = "decode 0.61× vs end-to-end 1.45×: TTFT moved (median TTFT 21 ms vs 138 ms for auto)"
    assert moved in trace["hovertext"][r][0]
    e2e, _ = dashboard.sweep_figures(issue_shape(), parse_selection({"speedup": "e2e"}))
    (trace,) = e2e["speedup"]["data"]
    assert trace["text"][r][0] == "1.45×<br>single run<br>TTFT moved" and trace["meta"]["speedup"] == "end_to_end"


# --- stored points: the decomposition's decode speedup is the heatmap's ----------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("repeats", [1, 3])
def test_decode_speedup_equals_tau_over_relative_step_cost_for_every_stored_point(client, repeats):
    sweep = make_users_grid(repeats=repeats)
    data = client.get(reverse("analysis:sweep_data", args=[sweep.pk]) + "?points=1").json()
    heat = next(t for t in data["figures"]["speedup"]["data"] if t["meta"]["concurrency"] == 1)
    assert heat["meta"]["speedup"] == "decode"
    decomposition = data["figures"]["decomposition"]
    checked = 0
    for row, (xl, xr) in enumerate((("x", "x2"), ("x3", "x4"), ("x5", "x6"))):
        tp = (1, 4, 8)[row]
        tau = next(t for t in decomposition["data"] if t["xaxis"] == xl and t["name"] == "τ (server counters)")
        cost = next(t for t in decomposition["data"] if t["xaxis"] == xr and t["type"] == "bar")
        for lab, t, c in zip(tau["x"], tau["y"], cost["y"], strict=True):
            z = heat["z"][heat["y"].index(lab)][heat["x"].index(f"TP{tp}")]
            assert t / c == pytest.approx(z, rel=2e-3), (lab, tp)  # the panel's decode speedup = the heatmap's
            checked += 1
        best = max((heat["z"][heat["y"].index(lab)][heat["x"].index(f"TP{tp}")], lab) for lab in tau["x"])[1]
        (sentence,) = re.findall(rf"TP{tp}: .*?(?= TP\d+: |$)", decomposition["caption"])
        if repeats == 1:  # single runs: the caption names no fastest (benchkit.compare.verdicts.verdict)
            assert "by the decode speedup, single runs: no verdict." in sentence, sentence
        else:  # zero-width intervals: separated, the fastest named as the headline names it
            assert f"{best} is fastest: decode speedup" in sentence, sentence
    assert checked == 15  # 5 speculative configurations x 3 TP degrees
    # and per stored run: tau / relative step cost = baseline median TPOT / the run's TPOT
    cols = data["points"]["columns"]
    rows = [dict(zip(cols, r, strict=True)) for r in data["points"]["rows"]]
    pts = [Point(run_id=r["run_id"], tp=r["tp"], concurrency=r["concurrency"], output_len=r["output_len"],
                 input_len=r["input_len"], method=r["label"] if r["label"] in ("auto", "linear") else "ddtree",
                 tree_budget=int(r["label"][1:]) if r["label"].startswith("b") else None,
                 figures_={f: r[f] for f in figures.POINT_METRICS}) for r in rows]
    costs = relative_step_costs(pts)
    ar = {}
    for p in pts:
        if p.label == "auto":
            ar.setdefault(p.match_key(), []).append(p.median_tpot_ms)
    for p in pts:
        if p.label != "auto":
            base = sorted(ar[p.match_key()])[len(ar[p.match_key()]) // 2]
            assert p.acceptance_length / costs[p.run_id] == pytest.approx(base / p.median_tpot_ms, rel=1e-9)


def test_excluded_points_are_listed_and_drawn_hollow_in_tp_scaling():
    pts = issue_shape()
    assert dashboard.excluded_rows(pts, Selection()) == [
        {"run_id": 4, "label": "ngram k=4", "tp": 1, "concurrency": 1, "output_len": 128,
         "reason": verdicts.exclusion_reason(pts[3])}]
    tp2 = [p.replace(tp=2, run_id=p.run_id + 10) for p in pts]
    kept, reasons = verdicts.split_excluded(pts + tp2)
    fig = figures.tp_scaling_figure(kept, excluded=[(p, reasons[p.run_id]) for p in pts + tp2 if p.run_id in reasons])
    assert {t["name"] for t in fig["data"] if not t["meta"].get("excluded")} == {"auto", "draft_model k=2",
                                                                                  "draft_model k=4"}
    (hollow,) = [t for t in fig["data"] if t["meta"].get("excluded")]
    assert hollow["marker"]["symbol"] == "circle-open" and hollow["x"] == ["TP1", "TP2"]
    assert all("excluded, median TPOT 0 ms" in h for h in hollow["hovertext"])


def test_empty_figures_say_when_every_counted_run_is_excluded():
    """A selection whose every counted run the rules exclude: the figures say so (and how many),
    not that there are no counted runs."""
    from analysis import figures
    gone = [(point(1, tpot=0.0), "median TPOT 0 ms"), (point(2, method="ngram", k=4), "suspect mark client_stalled")]
    for fig in (figures.tp_scaling_figure([], excluded=gone), figures.tradeoff_figure([], excluded=gone),
                figures.decomposition_figure([], excluded=gone)):
        text = json.dumps(fig)
        assert "all 2 counted runs of this selection are excluded" in text, text
    assert "No counted runs in this selection." in json.dumps(figures.tp_scaling_figure([]))


def test_an_ar_only_sweep_says_there_is_nothing_to_compare():
    """Issue 31: a sweep of autoregressive runs only read "no autoregressive baseline matched"."""
    from analysis.history import _headline
    ar_only = [point(i, repeat=i) for i in range(2)]
    assert [r.get("empty") for r in _headline(ar_only)] == ["only the autoregressive baseline ran: nothing to compare"]
    no_baseline = [point(1, "ngram", 4)]
    assert [r.get("empty") for r in _headline(no_baseline)] == ["no autoregressive baseline matched"]


def test_the_compare_hover_puts_tokens_only_after_known_lengths():
    """Issue 31: an imported point without lengths hovered "not in the file tokens"."""
    from analysis.history_figures import compare_figure
    from benchkit.compare.sweepdiff import BETTER, MetricChange, PointDiff
    from benchkit.point import SPEED_FIELD

    def diff(p):
        return PointDiff(p.identity_key(), p, [1], [2], {SPEED_FIELD: MetricChange(SPEED_FIELD, 100.0, 120.0, 20.0)},
                         BETTER, True, (), ())
    unknown = dataclasses.replace(point(1), input_len=None, output_len=None)
    texts = [t for tr in compare_figure([diff(unknown), diff(point(2, "ngram", 4))], 5.0, "a", "b")["data"]
             for t in tr.get("text", [])]
    assert any("lengths not in the file · runs" in t for t in texts)
    assert any("128/128 tokens · runs" in t for t in texts)
    assert not any("not in the file tokens" in t for t in texts)


def test_two_repeats_are_not_called_single_runs():
    """Issue 31: a cell whose configurations have 2 repeats says "fewer than 3 repeats", never
    "single runs"; "single runs" only where every side has one run."""
    from benchkit.compare import verdicts as v
    from benchkit.compare.speedups import DECODE, compute_speedups
    from benchkit.point import Point

    def pts(reps):
        out, rid = [], 0
        for method, k, tpot in (("auto", None, 10.0), ("ngram", 4, 5.0), ("ngram", 8, 6.0)):
            for r in range(reps):
                rid += 1
                out.append(Point(method=method, num_speculative_tokens=k, run_id=rid, repeat_index=r,
                                 figures_={"median_tpot_ms": tpot + 0.01 * r}))
        return out

    two = v.verdict(compute_speedups(pts(2), figures=(DECODE,)), DECODE)
    one = v.verdict(compute_speedups(pts(1), figures=(DECODE,)), DECODE)
    assert (two.kind, two.sentence) == (v.FEW, "fewer than 3 repeats: no verdict")
    assert (one.kind, one.sentence) == (v.SINGLE, "single runs: no verdict")
