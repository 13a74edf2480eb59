"""Issue 19, "unknown is shown as unknown": every page and export is rendered for (a) sweeps whose
figures are all unknown (succeeded runs whose metrics are all None, one without a metrics row,
a failed run, a host whose GPU states no memory) and (b) imported folders (the users'
`bench_results/` twice, as two nights of one series, and real AIPerf, GuideLLM and `vllm bench
sweep` files, through `manage.py import_results`), and no page says `None`, `nan` or `inf`, or
prints a unit without its number (analysis.display, analysis/templatetags/fig.py).

What is read: the visible text of each HTML page (tags stripped, entities unescaped) and its
`title` attributes; every string of the Plotly figures embedded in a page or served by a JSON
endpoint (hover text, labels, titles), which must also parse without NaN or Infinity; the
exports (CSV: an unknown is an empty cell; JSON: null; LaTeX: "--" or "not in the file").
"""

from __future__ import annotations

import csv
import html
import io
import json
import re
import shutil
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.template import Context, Template
from django.urls import reverse

from analysis import display
from benchkit.execution.outcome import RunOutcome
from benchkit.hosts.inventory import GpuInfo, HostInventory
from benchkit.measure.metrics import WindowMetrics
from benchkit.specs import GpuRef
from runs.models import Run, RunState, Sweep
from runs.services.hosts import record_inventory
from runs.services.outcomes import store_outcome
from runs.services.transitions import transition
from tests.factories import make_host, make_run, make_sweep

pytestmark = pytest.mark.django_db
FIXTURES = Path(__file__).parent / "fixtures"
BENCH_RESULTS = FIXTURES / "results" / "bench_results"
HARNESSES = FIXTURES / "harnesses"

#: A word no page may show: Python's None, float NaN / infinity as str() or json.dumps write them.
#: Not inside a lower-case word ("nano", "financial", "info"); "TPNone" is caught.
FORBIDDEN = re.compile(r"(?<![a-z])(None|nan|NaN|-?inf|-?Infinity)(?![a-z])")
#: Units of the pages' figures, longest first; WORD_UNITS are also words of the prose ("tokens
#: per chunk", "s x 1000"), checked only where a value was left empty.
UNITS = ("tok/s/GPU", "tok/s/kW", "tokens/step", "ms/token", "J/token", "tok/s", "req/s", "USD", "MiB", "MHz", "°C",
         "ms", "s", "W", "J", "%")
WORD_UNITS = ("tokens", "prompts", "×", "x")
_END = r"(?=$|[\s,;:.)\]])"
#: A unit with no number before it: after two spaces (an empty value between them) or right
#: after the unknown marker; a symbol unit also at the start of the text or of a line, or after
#: ", " / "; " / ": " / "= ".
ORPHAN_UNIT = re.compile(
    r"(?:(?:^|\n[^\S\n]*|[,;:=][^\S\n]+)(" + "|".join(map(re.escape, UNITS)) + ")" + _END + ")"
    r"|(?:(?:[^\S\n]{2}|[—–][^\S\n]*)(" + "|".join(map(re.escape, UNITS + WORD_UNITS)) + ")" + _END + ")")
SCRIPT = re.compile(r"<script\b[^>]*>(.*?)</script>", re.S)
TITLE = re.compile(r'\btitle="([^"]*)"')


def visible_text(page: str) -> str:
    """The text a reader sees: scripts and styles dropped, tags removed (no space put in their
    place: "<b>5</b> ms" is "5 ms"), entities unescaped; then each `title` attribute, one a line."""
    body = re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", "", body))
    return text + "\n" + "\n".join(html.unescape(t) for t in TITLE.findall(page))


def _strict_json(text: str):
    def refuse(const: str):
        raise AssertionError(f"JSON holds {const}")
    return json.loads(text, parse_constant=refuse)


def _strings(obj, path: str = ""):
    """(path, string) of every string in a JSON value."""
    if isinstance(obj, str):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _strings(v, f"{path}[{i}]")


def problems_in_json(data, where: str) -> list[str]:
    """Strings of a figure / data JSON value that say None, nan or inf (Plotly shows them)."""
    return [f"{where}{path}: {s[:160]!r}" for path, s in _strings(data) if FORBIDDEN.search(s)]


def problems_in_text(text: str, where: str) -> list[str]:
    """Forbidden words and orphan units of a text, each with the text around it."""
    out = []
    for rx, what in ((FORBIDDEN, "word"), (ORPHAN_UNIT, "orphan unit")):
        for m in rx.finditer(text):
            around = " ".join(text[max(0, m.start() - 60):m.end() + 40].split())
            out.append(f"{where}: {what} {m.group(m.lastindex)!r} in …{around}…")
    return out


def check_page(client, url: str) -> list[str]:
    """Problems of one page or JSON endpoint (HTTP 200 required)."""
    resp = client.get(url)
    assert resp.status_code == 200, (url, resp.status_code)
    body = resp.content.decode()
    if resp["Content-Type"].startswith("application/json"):
        return problems_in_json(_strict_json(body), url)
    out = problems_in_text(visible_text(body), url)
    for blob in SCRIPT.findall(body):
        if blob.strip().startswith("{"):
            out += problems_in_json(_strict_json(blob), url + " <script>")
    return out


def check_exports(client, sweep: Sweep) -> list[str]:
    """Problems of a sweep's CSV, JSON and LaTeX exports."""
    out = []
    rows = list(csv.reader(io.StringIO(client.get(reverse("analysis:sweep_export", args=[sweep.pk, "csv"]))
                                      .content.decode())))
    assert len(rows) > 1
    out += [f"csv row {i}: {cell!r}" for i, row in enumerate(rows) for cell in row if FORBIDDEN.fullmatch(cell)]
    exported = _strict_json(client.get(reverse("analysis:sweep_export", args=[sweep.pk, "json"])).content.decode())
    # vllm bench serve's own layout writes an unlimited request rate as the string "inf" (its
    # importer reads it back): that key keeps the tool's convention; no other string may say it
    for run in exported["runs"]:
        if run.get("request_rate") == "inf":
            run.pop("request_rate")
    out += problems_in_json(exported, "export.json")
    tex = client.get(reverse("analysis:sweep_export", args=[sweep.pk, "tex"])).content.decode()
    out += [f"export.tex: {m.group(0)!r}" for m in FORBIDDEN.finditer(tex)]
    return out


def pages_of(sweeps: list[Sweep], compare: tuple[Sweep, Sweep], host: str, series: str) -> list[str]:
    """Every page of the site for these sweeps: home, sweep list, each sweep's page, data, run
    list and every run page, compare, trend, host, glossary, and the history JSON endpoints."""
    old, new = compare
    urls = [reverse("analysis:home"), reverse("analysis:home_data"), reverse("analysis:sweep_list"),
            reverse("analysis:compare") + f"?old={old.pk}&new={new.pk}",
            reverse("analysis:compare_data") + f"?old={old.pk}&new={new.pk}",
            reverse("analysis:trend") + f"?host={host}&series={series}",
            reverse("analysis:trend_data") + f"?host={host}&series={series}",
            reverse("analysis:host_detail", args=[host]), reverse("analysis:glossary")]
    for s in sweeps:
        urls += [reverse("analysis:sweep_detail", args=[s.pk]), reverse("analysis:sweep_runs", args=[s.pk]),
                 reverse("analysis:sweep_data", args=[s.pk]) + "?points=1"]
        urls += [reverse("analysis:run_detail", args=[pk]) for pk in s.runs.values_list("pk", flat=True)]
    return urls


def _succeed(run: Run, metrics: WindowMetrics | None) -> Run:
    """Drive a stored run to succeeded: with `metrics` through store_outcome, without them by
    transitions alone (a run that kept no metrics row)."""
    for state in (RunState.PREFLIGHT, RunState.STARTING, RunState.WARMING, RunState.MEASURING, RunState.STOPPING):
        transition(run, state)
    if metrics is None:
        return transition(run, RunState.SUCCEEDED)
    return store_outcome(run, RunOutcome(ok=True, metrics=metrics))


def all_unknown_series() -> tuple[Sweep, Sweep]:
    """Two nights of the series "all unknown" on host "nothing-known" (one GPU whose memory and
    NUMA node are unknown): auto and draft_model k=2 succeeded with every figure None, ngram
    k=4 succeeded with no metrics row, a failed run."""
    host = make_host("nothing-known")
    record_inventory(host, HostInventory(hostname=host.name, gpus=[GpuInfo(index=0, uuid="GPU-unknown")]))
    gpus = [GpuRef(index=0, uuid="GPU-unknown")]
    nights = []
    for _ in range(2):
        sweep = make_sweep(host, name="all unknown")
        _succeed(make_run(sweep, gpus=gpus), WindowMetrics())
        _succeed(make_run(sweep, method="draft_model", k=2, gpus=gpus), WindowMetrics())
        _succeed(make_run(sweep, method="ngram", k=4, gpus=gpus), None)
        failed = make_run(sweep, method="ngram", k=2, gpus=gpus)
        transition(failed, RunState.PREFLIGHT)
        store_outcome(failed, RunOutcome(ok=False, reason="server_start_failed", message="no"))
        nights.append(sweep)
    return nights[0], nights[1]


def _import(*args) -> None:
    try:
        call_command("import_results", *map(str, args), stdout=StringIO())
    except CommandError as exc:  # the users' folder holds one truncated file, refused by design
        assert "1 of 18 file(s) refused" in str(exc)


def imported_sweeps(tmp_path: Path) -> tuple[Sweep, Sweep, Sweep]:
    """(night 1, night 2) of the users' `bench_results/` (series "bench_results" on host
    "imported"; night 2 from a copy whose bytes differ by trailing blank lines, so it is not
    the same file twice) and the sweep "harnesses": real AIPerf (auto and draft_model k=2),
    GuideLLM and `vllm bench sweep` files."""
    pattern = ("--name-pattern", "tp{tp}-{method}.json", "--sweep-name", "bench_results", "--host", "imported")
    _import(BENCH_RESULTS, *pattern)
    copy = tmp_path / "bench_results"
    shutil.copytree(BENCH_RESULTS, copy)
    for path in copy.glob("*.json"):
        path.write_bytes(path.read_bytes() + b"\n\n")
    _import(copy, *pattern)
    _import(HARNESSES / "aiperf" / "auto" / "profile_export_aiperf.json", "--method", "auto", "--host", "imported",
            "--sweep-name", "harnesses")
    sweep = Sweep.objects.get(name="harnesses")
    _import(HARNESSES / "aiperf" / "draft_model-k2" / "profile_export_aiperf.json", "--method", "draft_model",
            "--num-speculative-tokens", "2", "--into-sweep", sweep.pk)
    _import(HARNESSES / "guidellm" / "auto" / "benchmarks.json", "--method", "auto", "--into-sweep", sweep.pk)
    _import(HARNESSES / "vllm-bench-sweep" / "sweep", "--into-sweep", sweep.pk)
    old, new = Sweep.objects.filter(name="bench_results").order_by("pk")
    return old, new, sweep


def test_sweeps_whose_figures_are_all_unknown_show_no_none_nan_or_orphan_unit(client):
    old, new = all_unknown_series()
    assert new.runs.filter(state=RunState.SUCCEEDED).count() == 3
    problems = []
    for url in pages_of([old, new], (old, new), "nothing-known", "all unknown"):
        problems += check_page(client, url)
    problems += check_exports(client, new)
    assert not problems, "\n".join(problems)
    # and the unknown figures are there, marked as unknown with a reason
    run = new.runs.get(method="auto")
    page = client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode()
    assert page.count(f'<span class="unknown" title="{display.WHY_NOT_MEASURED}">—</span>') >= 30


def test_imported_folders_show_no_none_nan_or_orphan_unit(client, tmp_path):
    old, new, harnesses = imported_sweeps(tmp_path)
    assert Run.objects.filter(sweep=new, output_len__isnull=True).count() == 34  # vLLM files state no length
    problems = []
    for url in pages_of([new, harnesses], (old, new), "imported", "bench_results"):
        problems += check_page(client, url)
    for sweep in (new, harnesses):
        problems += check_exports(client, sweep)
    assert not problems, "\n".join(problems)
    # the issue's cases, now written as unknown
    sweep_page = visible_text(client.get(reverse("analysis:sweep_detail", args=[new.pk])).content.decode())
    assert "vs auto, output length not in the file" in sweep_page
    home = visible_text(client.get(reverse("analysis:home")).content.decode())
    assert "output length not in the file" in home
    data = client.get(reverse("analysis:sweep_data", args=[new.pk])).json()
    captions = [text for _, text in _strings(data["figures"])]
    assert any("output length not in the file" in t for t in captions)
    assert not any("not in the file output tokens" in t for t in captions)
    compare = visible_text(client.get(reverse("analysis:compare") + f"?old={old.pk}&new={new.pk}").content.decode())
    assert "not in the file" in compare
    run = new.runs.filter(metrics__max_output_tokens_per_s__isnull=True).first() or new.runs.first()
    page = client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode()
    assert f'title="{display.WHY_NOT_IN_FILE}">—</span>' in page


@pytest.mark.parametrize(("value", "spec", "want"), [
    (182.04, "1 tok/s", "182.0 tok/s"), (6.5, "2 ×", "6.50×"), (1.857, "2 x", "1.86x"), (128, "", "128"),
    (0.0, "2 ms", "0.00 ms"), (3.5, "USD", "3.5 USD"), ("12.5", "%", "12.5 %"), (0, "0 tokens", "0 tokens"),
])
def test_fig_writes_the_number_with_its_unit(value, spec, want):
    assert Template('{% load fig %}{{ v|fig:s }}').render(Context({"v": value, "s": spec})) == want


@pytest.mark.parametrize("value", [None, "", float("nan"), float("inf"), float("-inf")])
def test_fig_writes_an_unknown_as_the_marker_never_the_unit(value):
    out = Template('{% load fig %}{{ v|fig:"1 tok/s" }}|{{ v|stated:"tokens|output length" }}|{{ v|inout:5 }}|'
                   '{% figure v "ms" 2 %}|{% figure v "ms" 2 why="not asked" %}').render(
        Context({"v": value, "unknown_why": "page reason"}))
    fig, stated, inout, tag, tag_why = out.split("|")
    assert fig == f'<span class="unknown" title="{display.WHY_UNKNOWN}">—</span>'
    assert stated == f'<span class="unknown" title="{display.WHY_WORKLOAD}">output length not in the file</span>'
    assert inout == f'<span class="unknown" title="? = {display.WHY_WORKLOAD}">?/5</span>'
    assert tag == '<span class="unknown" title="page reason">—</span>'
    assert tag_why == '<span class="unknown" title="not asked">—</span>'


def test_the_checks_catch_what_the_issue_saw():
    """The text checks fail on the issue's examples (so the page tests can fail)."""
    for bad in ("vs auto, None output tokens", "concurrency 2, None tokens", "c2 None/None", "window  s",
                "12.0 tok/s (total  tok/s,  req/s)", "TPnan", "speedup inf×", "— ms"):
        assert problems_in_text(f"<td>{bad}</td>".replace("<td>", "").replace("</td>", ""), "x"), bad
    for good in ("window 1.20 s", "12.0 tok/s (total 20.0 tok/s, 0.125 req/s)", "median TTFT (ms)",
                 "output tok/s", "6.50× (single run; 182.0 tok/s)", "error rate —"):
        assert not problems_in_text(good, "x"), good
    assert problems_in_json({"text": ["auto · TP1 · None/None tokens"]}, "fig")
    with pytest.raises(AssertionError):
        _strict_json('{"y": [NaN]}')
