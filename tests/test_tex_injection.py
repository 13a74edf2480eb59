"""Issue 31: a sweep name (or any user text) in TeX is text, never TeX. `export.tex` put the sweep
name raw into `\\caption{...}`: a sweep named `\\input{/etc/passwd}` pulled that file into the PDF a
user compiles. Every TeX writer now uses analysis.tex.tex_escape; the export is compiled here by
the real pdflatex and read back with pdftotext."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from django.urls import reverse

from analysis import report
from analysis.tex import tex_escape, verbatim_lines
from tests.factories import finish_run, make_run, make_sweep

pytestmark = pytest.mark.django_db

#: Names that would be TeX if written raw: a file read, a shell escape, an unbalanced brace, every
#: special character.
HOSTILE = [r"\input{/etc/passwd}", r"\immediate\write18{ls}", "a } b { c }}", r"50% # _ & ~ ^ \\ $x$",
           r"\end{document}"]

needs_tex = pytest.mark.skipif(not (shutil.which("pdflatex") and shutil.which("pdftotext")),
                               reason="needs pdflatex and pdftotext: bash scripts/system_deps.sh")


def _export(client, name: str) -> str:
    sweep = make_sweep(name=name)
    finish_run(make_run(sweep, method=r"auto"))
    resp = client.get(reverse("analysis:sweep_export", args=[sweep.pk, "tex"]))
    assert resp.status_code == 200
    return resp.content.decode()


@pytest.mark.parametrize("name", HOSTILE)
def test_export_tex_caption_is_escaped(client, name):
    tex = _export(client, name)
    caption = next(ln for ln in tex.splitlines() if ln.startswith("\\caption{"))
    assert caption == "\\caption{" + tex_escape(name) + " (sweep " + caption.rsplit("(sweep ", 1)[1]
    assert "\\input{" not in tex and "\\write18" not in tex and "\\end{document}" not in tex


def _compile(tmp_path: Path, fragment: str) -> str:
    doc = tmp_path / "doc.tex"
    doc.write_text("\\documentclass{article}\\usepackage{booktabs}\\begin{document}\n" + fragment
                   + "\n\\end{document}\n")
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", doc.name],
                          cwd=tmp_path, capture_output=True, text=True, errors="replace", timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:]
    return subprocess.run(["pdftotext", str(tmp_path / "doc.pdf"), "-"], capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.pdflatex
@needs_tex
def test_export_tex_compiles_to_the_literal_name(client, tmp_path):
    """The whole export of a sweep named `\\input{/etc/passwd}` (and the other hostile names),
    compiled by pdflatex: the PDF shows the name as written and none of /etc/passwd."""
    passwd = Path("/etc/passwd").read_text().splitlines()[0]  # root:x:0:0:...
    for name in HOSTILE:
        tex = _export(client, name)
        # pdftotext reads \\textasciitilde / \\textasciicircum as the spacing accents U+02DC, U+02C6
        text = " ".join(_compile(tmp_path, tex).split()).replace("\u02dc", "~").replace("\u02c6", "^")
        assert " ".join(name.split()) + " (sweep " in text, (name, text[:400])
        assert passwd.split(":")[0] + ":x:" not in text


def test_verbatim_command_line_cannot_end_the_environment():
    """A server argument holding `\\end{verbatim}` would end the report's verbatim block and make
    the rest of the line TeX (`\\input{/etc/passwd}`): it is cut and marked instead."""
    lines = report.wrap_command(r"python -m x --arg \end{verbatim}\input{/etc/passwd}")
    assert not any("\\end{verbatim}" in ln for ln in lines)
    assert lines == verbatim_lines(lines)
    assert "".join(ln.removesuffix("\\\\").lstrip() for ln in lines).replace("--arg ", "--arg") == \
        r"python -m x --arg\end{verbatim}\input{/etc/passwd}".replace("--arg", "--arg")
