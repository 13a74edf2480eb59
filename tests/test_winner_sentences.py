"""Every sentence that names a winner obeys the verdict rule (issue 32; docs/VERDICTS.md): on a
sweep whose top two configurations tie (overlapping intervals over 3 repeats), no page, figure
caption or report names either as faster/fastest/best/highest; on a separated sweep the winner
is named where the headline names it."""

from __future__ import annotations

import html as html_lib
import io
import json
import re

import pytest
from django.core.management import call_command
from django.urls import reverse

from runs.management.commands.demo import Command as DemoCommand
from runs.models import Run
from tests.factories import finish_run, make_run, make_sweep

pytestmark = pytest.mark.django_db

LABELS = ("ngram k=4", "draft_model k=8")
WINNER_WORDS = re.compile(r"\b(faster|fastest|wins?|best|highest)\b", re.I)
NO_WINNER = ("tie within noise", "ties within noise", "no verdict", "no winner beyond noise")


def build(tie: bool):
    """auto, ngram k=4 and draft_model k=8 at TP1 and TP2, 3 repeats each; ngram k=4 and
    draft_model k=8 overlap (`tie`) or draft_model is clearly slower."""
    sw = make_sweep(name="tie" if tie else "separated")
    for tp in (1, 2):
        for rep, jitter in enumerate((0.0, 5.0, 10.0)):
            finish_run(make_run(sw, "auto", tp=tp, repeat=rep), gap_ms=50 + jitter)
            finish_run(make_run(sw, "ngram", 4, tp=tp, repeat=rep), tokens_per_msg=3, gap_ms=50 + jitter,
                       spec_decode={"acceptance_length": 3.0})
            finish_run(make_run(sw, "draft_model", 8, tp=tp, repeat=rep), tokens_per_msg=3,
                       gap_ms=(52 + jitter) if tie else 100 + jitter, spec_decode={"acceptance_length": 3.5})
    return sw


def text_of(content: str) -> str:
    content = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", content, flags=re.S)
    return re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", content)))


def captions(data: dict) -> str:
    out = []
    for fig in (data.get("figures") or {}).values():
        for f in ([fig] if "layout" in fig or "empty" in fig else fig.values()):
            if isinstance(f, dict):
                out.append(json.dumps(f.get("layout", {}).get("title", "")) + " " + str(f.get("caption", ""))
                           + " " + str(f.get("empty", "")))
    return " ".join(out)


def offending(text: str) -> list[str]:
    """Sentences in which a winner word stands within 60 characters of a configuration's name
    (either side) and that say no 'tie within noise' / 'no verdict'."""
    names = "|".join(re.escape(lab) for lab in LABELS)
    gap = r"(?:[^.]|\.(?=\d)){0,60}?"  # a decimal point does not end the sentence
    near = re.compile(rf"({names}){gap}{WINNER_WORDS.pattern}|{WINNER_WORDS.pattern}{gap}({names})", re.I)
    return [sentence.strip() for sentence in re.split(r"(?<=\.)\s+", text)
            if near.search(sentence) and not any(n in sentence for n in NO_WINNER)]


def every_text(client, sw) -> dict[str, str]:
    pages = {
        "sweep page": text_of(client.get(reverse("analysis:sweep_detail", args=[sw.pk])).content.decode()),
        "sweep data": captions(client.get(reverse("analysis:sweep_data", args=[sw.pk])).json()),
        "report": text_of(client.get(reverse("analysis:sweep_report", args=[sw.pk])).content.decode()),
        "what to run": text_of(client.get(reverse("analysis:sweep_what_to_run", args=[sw.pk])).content.decode()),
    }
    for run in Run.objects.filter(sweep=sw):
        pages[f"run {run.pk}"] = text_of(client.get(reverse("analysis:run_detail", args=[run.pk])).content.decode())
    out = io.StringIO()
    DemoCommand(stdout=out)._summary(sw)
    pages["demo summary"] = out.getvalue()
    out = io.StringIO()
    call_command("recommend", str(sw.pk), stdout=out)
    pages["recommend"] = out.getvalue()
    return pages


def test_a_tie_names_no_winner_anywhere(client):
    sw = build(tie=True)
    pages = every_text(client, sw)
    assert "tie within noise" in pages["sweep page"]
    bad = {name: offending(text) for name, text in pages.items() if offending(text)}
    assert not bad, {k: [x[:300] for x in v] for k, v in bad.items()}


def test_a_separated_winner_is_named_consistently(client):
    sw = build(tie=False)
    pages = every_text(client, sw)
    assert "ngram k=4 is fastest: decode speedup" in pages["sweep data"]  # the decomposition caption
    assert "draft_model k=8 is fastest" not in " ".join(pages.values())
