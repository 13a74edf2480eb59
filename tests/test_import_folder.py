"""The users' `bench_results/` folder (DOMAIN.md; tests/fixtures/results/bench_results/, written by
make_bench_results.py from the users' own figures, with the stale truncated file of the aborted
TP4 run) imports as one sweep whose pages compare TP degrees and DDTree budgets."""

from __future__ import annotations

import shutil
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runs.models import ResultFile, Run, Sweep
from runs.services.imports import import_result_folder

pytestmark = pytest.mark.django_db
FOLDER = Path(__file__).parent / "fixtures" / "results" / "bench_results"
PATTERN = "tp{tp}-{method}.json"
BUDGETS = ("auto", "linear", "b15", "b16", "b32", "b64")


def import_folder(folder: Path, *args: str) -> tuple[str, str]:
    """(stdout, the CommandError's message or "") of `import_results FOLDER --name-pattern PATTERN`."""
    out = StringIO()
    try:
        call_command("import_results", str(folder), "--name-pattern", PATTERN, *args, stdout=out)
    except CommandError as exc:
        return out.getvalue(), str(exc)
    return out.getvalue(), ""


def test_users_folder_becomes_one_sweep_of_tp_by_budget(client):
    out, error = import_folder(FOLDER)
    # the stale file of the aborted run is refused with its reason, the other 17 import
    assert "1 of 18 file(s) refused" in error
    assert f"refused           {FOLDER / 'tp4-b64.json'}:2: truncated (ends inside a list)" in out
    sweep = Sweep.objects.get()
    assert sweep.name == "bench_results" and ResultFile.objects.filter(sweep=sweep).count() == 17
    assert Run.objects.filter(sweep=sweep, state="succeeded").count() == 34

    data = client.get(f"/sweeps/{sweep.pk}/data.json?points=1").json()
    points = [dict(zip(data["points"]["columns"], row, strict=True)) for row in data["points"]["rows"]]
    grid = {(p["tp"], p["label"], p["concurrency"]) for p in points}
    assert grid == {(tp, m, c) for tp in (1, 4, 8) for m in BUDGETS for c in (1, 8)} - {(4, "b64", 1), (4, "b64", 8)}
    assert all(p["output_len"] is None for p in points)  # vLLM files do not say
    assert set(Run.objects.filter(sweep=sweep).values_list("engine", flat=True)) == {"vllm"}

    def tok_s(tp, label, c):
        [p] = [p for p in points if (p["tp"], p["label"], p["concurrency"]) == (tp, label, c)]
        return p["output_throughput_tok_s"]

    def speedups(conc, tp):
        """{label: speedup} of the heatmap's column TP`tp` in the panel of concurrency `conc`."""
        trace = next(t for t in data["figures"]["speedup"]["data"] if t["meta"]["concurrency"] == conc)
        col = trace["x"].index(f"TP{tp}")
        return {lab: row[col] for lab, row in zip(trace["y"], trace["z"], strict=True) if row[col] is not None}

    # the speedup heatmap: one panel per concurrency, configurations x TP, vs that TP's auto
    assert {t["meta"]["concurrency"] for t in data["figures"]["speedup"]["data"]} == {1, 8}
    tp1 = speedups(1, 1)
    assert tp1["b15"] == pytest.approx(6.5, abs=0.005)  # DOMAIN.md: 6.5x autoregressive at TP1
    assert tp1["b15"] / tp1["linear"] == pytest.approx(1.63, abs=0.005)  # and 1.63x linear DFlash
    assert max(tp1, key=tp1.get) == "b15"  # b15 is the best configuration at TP1
    assert tp1["b64"] < tp1["b32"] < tp1["b16"] < tp1["b15"]  # larger budgets lose speed
    assert set(speedups(8, 4)) == {"auto", "linear", "b15", "b16", "b32"}  # b64 was refused
    assert tok_s(4, "b15", 8) == 1270.8  # DOMAIN.md: TP4 b15 at 8 concurrent requests
    assert all(tok_s(4, m, 1) > tok_s(8, m, 1) for m in BUDGETS if m != "b64")  # single requests: TP4 beats TP8
    # acceptance length grows with the budget, speed does not (MEASUREMENT.md: rank by speed)
    taus = [next(p["acceptance_length"] for p in points if (p["tp"], p["label"], p["concurrency"]) == (1, m, 1))
            for m in ("b15", "b16", "b32", "b64")]
    assert taus == sorted(taus)

    page = client.get(f"/sweeps/{sweep.pk}/").content.decode()
    for label in BUDGETS:
        assert f">{label}</a></td>" in page


def test_second_import_of_the_folder_stores_nothing():
    import_folder(FOLDER)
    runs, sweeps = Run.objects.count(), Sweep.objects.count()
    out, error = import_folder(FOLDER)
    assert (Run.objects.count(), Sweep.objects.count()) == (runs, sweeps)
    assert out.count("already imported") == 17 and "1 of 18 file(s) refused" in error


def test_each_bad_file_is_refused_with_its_reason_and_the_others_import(tmp_path):
    folder = tmp_path / "bench_results"
    folder.mkdir()
    for name in ("tp1-auto.json", "tp1-b15.json"):
        shutil.copy(FOLDER / name, folder / name)
    # a partial file: the first run's completed is fewer than its num_prompts (an aborted run)
    lines = (FOLDER / "tp1-b32.json").read_text().splitlines()
    (folder / "tp1-b32.json").write_text(lines[0].replace('"completed": 16', '"completed": 11', 1) + "\n" + lines[1])
    shutil.copy(FOLDER / "tp1-b16.json", folder / "tp1-b0.json")  # a budget the method table refuses
    shutil.copy(FOLDER / "tp1-b16.json", folder / "tp1-tree16.json")  # an alias
    (folder / "notes.txt").write_text("run again after the reboot")

    report = import_result_folder(folder, PATTERN, aliases={"tree16": "b16"}, host="bench-host")
    by_name = {Path(f.path).name: f for f in report.files}
    assert by_name["notes.txt"].status == "skipped"
    assert by_name["tp1-b32.json"].status == "refused"
    assert by_name["tp1-b32.json"].reason == (f"{folder / 'tp1-b32.json'}:1: completed: partial result: 11 completed "
                                              "+ 0 failed of num_prompts 16 requests (the file of an aborted run?)")
    assert by_name["tp1-b0.json"].reason.startswith(f"{folder / 'tp1-b0.json'}: name token {{method}}: token 'b0'")
    assert [by_name[n].status for n in ("tp1-auto.json", "tp1-b15.json", "tp1-tree16.json")] == ["imported"] * 3
    budgets = set(Run.objects.filter(sweep=report.sweep).values_list("tree_budget", flat=True))
    assert budgets == {None, 15, 16} and report.sweep.host.name == "bench-host"


def test_name_tokens_must_agree_with_the_file(tmp_path):
    shutil.copy(FOLDER / "tp4-b15.json", tmp_path / "tp4-b15-c2.json")  # the file says max_concurrency 1 and 8
    out, error = import_folder(tmp_path, "--name-pattern", "tp{tp}-{method}-c{concurrency}.json")
    assert "max_concurrency: 1, but the file's name says concurrency 2" in out and Run.objects.count() == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--name-pattern", "tp{tp}-{budget}.json"], "unknown token {budget}"),
    (["--name-pattern", "tp{tp}.json"], "--method: give one"),
    (["--name-pattern", PATTERN, "--method", "auto"], "already has a {method} token"),
    (["--name-pattern", "nothing-{tp}.json", "--method", "auto"], "no file name matches"),
])
def test_folder_options_are_checked(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("import_results", str(FOLDER), *args)
    assert Sweep.objects.count() == 0
