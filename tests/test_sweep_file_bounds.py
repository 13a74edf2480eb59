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
