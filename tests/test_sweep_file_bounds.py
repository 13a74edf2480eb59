"""Issue 31: sweep files are bounded. A 524-byte YAML alias bomb grew to a MemoryError and a 50 MB
file was accepted after 400 s, from `start_sweep` and the admin's form: benchkit.configfile.load_yaml
refuses anchors/aliases at their line and text over MAX_YAML_BYTES before parsing."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from benchkit.configfile import MAX_YAML_BYTES
from runs.models import Run, Sweep

pytestmark = pytest.mark.django_db

BOMB = "name: x\nengine: vllm\nmodel: m\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
BOMB += "grid: {methods: [*i]}\n"
BIG = "name: x\nengine: vllm\nmodel: m\ngrid: {methods: [auto]}\ndescription: " + "y" * (50 * 1024 * 1024) + "\n"


@pytest.mark.parametrize("text, message", [
    (BOMB, ":4: invalid YAML: YAML anchor &a: anchors and aliases are not read"),
    (BIG, f"{len(BIG):,} bytes: larger than the {MAX_YAML_BYTES:,} bytes a sweep file may have"),
], ids=["alias-bomb", "50MB"])
def test_start_sweep_refuses(tmp_path, text, message):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    for args in ((), ("--dry-run",)):
        with pytest.raises(CommandError, match=message.replace("(", r"\(")) as exc:
            call_command("start_sweep", str(path), *args)
        assert str(exc.value).startswith(f"{path}")
    assert not Sweep.objects.exists() and not Run.objects.exists()


@pytest.mark.parametrize("text, message", [
    (BOMB, "admin YAML:4: invalid YAML: YAML anchor &amp;a"),
    ("name: x\n" + "#" * (MAX_YAML_BYTES + 10) + "\n", "bytes a YAML file may have"),
], ids=["alias-bomb", "over-1MiB"])
def test_admin_form_refuses(client, django_user_model, text, message):
    admin = django_user_model.objects.create_superuser("root", "r@x.org", "pw")
    client.force_login(admin)
    resp = client.post("/admin/runs/sweep/create-from-yaml/", {"grid": text})
    assert resp.status_code == 200 and not Sweep.objects.exists()
    assert message in resp.content.decode()


GRID = "name: x\nengine: vllm\nmodel: m\ngrid: {methods: [auto], concurrency: [1, 2, 3, 4, 5]}\nrepeats: 2000001\n"
GRID_MESSAGE = ":4: grid: grid expands to 10,000,005 runs (concurrency 5 x repeats 2,000,001); the limit is 10,000"


def test_grid_point_count_refused_before_expansion(tmp_path, client, django_user_model, monkeypatch):
    """10^7 points reached 12.9 GB in `start_sweep --dry-run`: the count is refused from the parsed
    grid, and nothing is expanded (expand raises if called)."""
    from benchkit.sweeps import sweepfile

    def never(*a, **k):
        raise AssertionError("expanded")

    monkeypatch.setattr(sweepfile.SweepSpec, "expand", never)
    monkeypatch.setattr(sweepfile.SweepFile, "variants", never)
    path = tmp_path / "s.yaml"
    path.write_text(GRID)
    for args in ((), ("--dry-run",)):
        with pytest.raises(CommandError, match=GRID_MESSAGE.replace("(", r"\(").replace(")", r"\)")):
            call_command("start_sweep", str(path), *args)
    client.force_login(django_user_model.objects.create_superuser("root", "r@x.org", "pw"))
    resp = client.post("/admin/runs/sweep/create-from-yaml/", {"grid": GRID})
    assert resp.status_code == 200 and "admin YAML" + GRID_MESSAGE in resp.content.decode()
    assert not Sweep.objects.exists() and not Run.objects.exists()
