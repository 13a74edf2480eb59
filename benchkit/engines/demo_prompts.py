"""Categorized real-text prompts for the demo (issue 33, "A demo on real text"), no download.

The demo target (benchkit.engines.demo_models) is trained on a fixed list of Python
standard-library sources (`demo_models.CORPUS_FILES`). This module writes a JSON-lines prompt file
(the `jsonl` kind of benchkit.measure.datasets: `{"prompt": str, "category": str}` per line, plus
a `source` key that the readers ignore) with categories of text the target never saw:

- `code`: windows of Python standard-library modules that are NOT in the training corpus (nor
  among the modules whose docstrings make the demo's prompts.txt): the top-level `*.py` files of
  the standard library, then its packages (tests, idlelib and the like left out), then
  site-packages `*.py` as a last resort.
- `prose`: English prose from licence texts the machine has: `/usr/share/common-licenses/*` and
  the standard library's `LICENSE.txt` first, then `/usr/share/doc/*/copyright`, then the
  licence and METADATA files of installed distributions (`*.dist-info`). Paragraphs only (DEP-5
  field lines, lists of names and short lines left out), whitespace collapsed.
- `structured`: seeded, generated records (JSON lines and CSV with a header row), the same on
  every machine.

Each prompt is a window of at most `max_chars` characters (cut back to a whitespace boundary),
at least half of that long; given a tokenizer (`tokenizer`: a `tokenizer.json` or a model
directory holding one, e.g. the demo target's), a window of at most `max_tokens` tokens of it
instead, at least half of that many (the demo's input_len is 64 tokens; characters per token
differ a lot between code, prose and records). No window occurs anywhere in the training corpus's text (checked),
and no two prompts are equal. A group of sources that is missing is skipped; when a category
cannot be filled from what the machine has, DemoPromptError says which and where it looked.

Determinism: every source list is sorted, every choice comes from a `random.Random` seeded from
(`seed`, category), and the file is written with sorted keys, so the same arguments on the same
machine (same files installed) write the same bytes. Lines are interleaved by category (sorted
category order, round-robin, as benchkit.measure.datasets.select_prompts orders a sample), so any
prefix of the file spans every category; `warmup` extra prompts (also round-robin, distinct from
the rest) come first, for a run that takes its warmup requests from the head of the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

from benchkit.engines.demo_models import CORPUS_FILES, PROMPT_MODULES

#: The categories this module writes, in file order.
CATEGORIES = ("code", "prose", "structured")
#: Default window: about 60-100 tokens of the demo tokenizer (the demo's input_len is 64).
DEFAULT_MAX_CHARS = 256
#: The smallest window accepted (shorter prompts say little about acceptance).
MIN_CHARS = 64
#: Default token window with a tokenizer (the demo sweep's input_len), and the smallest accepted.
DEFAULT_MAX_TOKENS = 64
MIN_TOKENS = 16
#: Prompts per category by default.
DEFAULT_PER_CATEGORY = 8

#: Standard-library files never used as held-out code: generated tables, jokes, Easter eggs.
_CODE_SKIP = {"this.py", "antigravity.py", "__hello__.py", "stringprep.py", "keyword.py", "token.py",
              "__phello__", "_pydecimal.py"}
#: Standard-library directories left out of the package group (tests, GUIs, vendored code).
_CODE_SKIP_DIRS = {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages",
                   "dist-packages", "config-3", "__pycache__", "pydoc_data", "encodings", "distutils"}
_MAX_PASSES = 64
_FIELD_LINE = re.compile(r"^[A-Z][A-Za-z-]*:(\s|$)")


class DemoPromptError(RuntimeError):
    """A category of demo prompts cannot be filled from the files this machine has."""


# ---- sources ------------------------------------------------------------------------------

def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _site_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    return sorted({Path(paths[k]) for k in ("purelib", "platlib") if k in paths})


def training_files() -> list[Path]:
    """The files the demo target (and its tokenizer) were trained on: `demo_models.CORPUS_FILES`
    under the standard library, those that exist."""
    base = _stdlib_dir()
    return [base / rel for rel in CORPUS_FILES if (base / rel).is_file()]


def _excluded_code() -> set[str]:
    """Standard-library paths (relative, '/'-separated) never used as held-out code."""
    return set(CORPUS_FILES) | set(PROMPT_MODULES)


def _stdlib_top() -> list[Path]:
    base, skip = _stdlib_dir(), _excluded_code()
    if not base.is_dir():
        return []
    return [p for p in sorted(base.glob("*.py"))
            if p.name not in skip and p.name not in _CODE_SKIP and not p.name.startswith("_sysconfigdata")]


def _stdlib_packages() -> list[Path]:
    base, skip = _stdlib_dir(), _excluded_code()
    if not base.is_dir():
        return []
    out = []
    for pkg in sorted(d for d in base.iterdir() if d.is_dir()):
        if pkg.name in _CODE_SKIP_DIRS or pkg.name.startswith("config-") or not (pkg / "__init__.py").is_file():
            continue
        for p in sorted(pkg.rglob("*.py")):
            rel = p.relative_to(base).as_posix()
            if rel not in skip and not any(part in _CODE_SKIP_DIRS for part in rel.split("/")[:-1]):
                out.append(p)
    return out


def _site_sources() -> list[Path]:
    out: list[Path] = []
    for d in _site_dirs():
        if d.is_dir():
            out += [p for p in sorted(d.glob("*/*.py")) if "__pycache__" not in p.parts]
    return out


def _code_groups() -> list[Callable[[], list[Path]]]:
    """Held-out Python sources in priority order (each a callable giving a sorted list, called
    only when the groups before it did not fill the category): top-level standard-library
    modules, standard-library packages, site-packages. A missing directory gives an empty list."""
    return [_stdlib_top, _stdlib_packages, _site_sources]


def _common_licenses() -> list[Path]:
    out = sorted(p for p in Path("/usr/share/common-licenses").glob("*") if p.is_file())
    lic = _stdlib_dir() / "LICENSE.txt"
    return out + [lic] if lic.is_file() else out


def _debian_copyrights() -> list[Path]:
    return sorted(p for p in Path("/usr/share/doc").glob("*/copyright") if p.is_file())


def _dist_info_texts() -> list[Path]:
    out: list[Path] = []
    for d in _site_dirs():
        if not d.is_dir():
            continue
        for info in sorted(d.glob("*.dist-info")):
            out += sorted(p for p in info.iterdir() if p.is_file() and (
                p.name.upper().startswith(("LICENSE", "LICENCE", "COPYING")) or p.name == "METADATA"))
            if (info / "licenses").is_dir():
                out += sorted(p for p in (info / "licenses").rglob("*") if p.is_file())
    return out


def _prose_groups() -> list[Callable[[], list[Path]]]:
    """Licence and documentation texts in priority order (as `_code_groups`): the common
    licences and the standard library's LICENSE.txt; Debian copyright files; installed
    distributions' licences and METADATA."""
    return [_common_licenses, _debian_copyrights, _dist_info_texts]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


# ---- windows ------------------------------------------------------------------------------

def _window(text: str, max_chars: int) -> str:
    """`text` cut to at most `max_chars` characters, back to the last whitespace when that keeps
    at least three quarters of the window; trailing whitespace removed."""
    if len(text) > max_chars:
        cut = text[:max_chars]
        ws = max(cut.rfind(" "), cut.rfind("\n"))
        text = cut[:ws] if ws >= max_chars * 3 // 4 else cut
    return text.rstrip()


def _code_window(text: str, rng: random.Random, max_chars: int) -> str | None:
    """A window of source `text` starting at a seeded non-blank, non-comment line."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    if not starts:
        return None
    i = starts[rng.randrange(len(starts))]
    return _window("".join(lines[i:]), max_chars)


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a licence / copyright / METADATA text: blank-line (or DEP-5 ` .`)
    separated blocks, field lines (`License: ...`) dropped, whitespace collapsed; kept when they
    have at least 12 words and are mostly letters."""
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        s = line.strip()
        if not s or s == "." or set(s) <= set("-=*#_~ "):
            blocks.append([])
        elif _FIELD_LINE.match(line):
            blocks.append([])
        else:
            blocks[-1].append(s)
    out = []
    for block in blocks:
        para = " ".join(" ".join(block).split())
        words = para.split()
        letters = sum(c.isalpha() for c in para)
        if len(words) >= 12 and letters >= 0.75 * len(para.replace(" ", "")) and "@" not in para[:80]:
            out.append(para)
    return out


def _prose_window(paras: list[str], rng: random.Random, max_chars: int) -> str | None:
    """A window starting at a seeded paragraph, followed by the next ones ("\\n\\n" between)."""
    if not paras:
        return None
    i = rng.randrange(len(paras))
    return _window("\n\n".join(paras[i:]), max_chars)


_FIRST = ("Ada", "Bram", "Chen", "Dalia", "Emeka", "Freya", "Goran", "Hana", "Ilse", "Jonas", "Kemal", "Lucia",
          "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Sven", "Tamar", "Uma", "Viktor", "Wen", "Yusuf")
_LAST = ("Abara", "Berg", "Castillo", "Dubois", "Eriksen", "Fischer", "Gupta", "Haddad", "Ivanova", "Jensen",
         "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov", "Rossi", "Sato", "Tanaka", "Varga")
_CITIES = (("Lisbon", "PT"), ("Porto", "PT"), ("Lyon", "FR"), ("Ghent", "BE"), ("Leipzig", "DE"), ("Turin", "IT"),
           ("Krakow", "PL"), ("Brno", "CZ"), ("Malmo", "SE"), ("Tartu", "EE"), ("Cork", "IE"), ("Bilbao", "ES"))
_STATUS = ("pending", "paid", "shipped", "delivered", "returned", "cancelled")
_ITEMS = ("cable", "adapter", "keyboard", "monitor", "lamp", "chair", "notebook", "battery", "charger", "speaker")


def _record(rng: random.Random, i: int) -> dict[str, object]:
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    city, country = rng.choice(_CITIES)
    qty = rng.randint(1, 9)
    price = rng.randint(199, 19999) / 100
    return {"id": 10000 + 7 * i + rng.randint(0, 6), "customer": f"{first} {last}",
            "email": f"{first.lower()}.{last.lower()}@example.org", "city": city, "country": country,
            "item": rng.choice(_ITEMS), "sku": f"{rng.choice('ABCDEFGH')}{rng.randint(100, 999)}-{rng.randint(10, 99)}",
            "quantity": qty, "unit_price": price, "total": round(qty * price, 2), "status": rng.choice(_STATUS),
            "date": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"}


def _structured_text(rng: random.Random, index: int, max_chars: int) -> str:
    """Generated records, JSON lines for even `index`, CSV (header row first) for odd, long
    enough for one window."""
    out: list[str] = []
    if index % 2 == 1:
        cols = list(_record(rng, 0))
        out.append(",".join(cols))
    n = 0
    while sum(len(s) + 1 for s in out) < 2 * max_chars:
        rec = _record(rng, n)
        n += 1
        out.append(json.dumps(rec) if index % 2 == 0 else ",".join(str(v) for v in rec.values()))
    return "\n".join(out)


# ---- selection ----------------------------------------------------------------------------

def _rng(seed: int, category: str) -> random.Random:
    digest = hashlib.sha256(f"draftboard-demo-prompts:{seed}:{category}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _fill(category: str, groups: list[Callable[[], list[Path]]],
          extract: Callable[[Path, random.Random], str | None], n: int, rng: random.Random,
          accept: Callable[[str], bool], where: str) -> list[tuple[str, str]]:
    """`n` distinct (source, window) pairs from `groups` in priority order: each group's files in
    a seeded order, one window per file per pass, passes repeated while they find new windows."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for group in groups:
        files = list(group())
        rng.shuffle(files)
        for _ in range(_MAX_PASSES):
            found = False
            for path in files:
                if len(out) >= n:
                    return out
                text = extract(path, rng)
                if text and text not in seen and accept(text):
                    seen.add(text)
                    out.append((str(path), text))
                    found = True
            if not found or not files:
                break
        if len(out) >= n:
            return out
    raise DemoPromptError(f"demo prompts: category {category!r} needs {n} prompt(s), found {len(out)} "
                          f"distinct held-out window(s) in {where}")


def _check_args(per_category: int, seed: int, max_chars: int, categories: Sequence[str], warmup: int,
                max_tokens: int) -> None:
    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not is_int(per_category) or per_category < 1:
        raise ValueError(f"per_category must be an integer >= 1, got {per_category!r}")
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if not is_int(max_chars) or max_chars < MIN_CHARS:
        raise ValueError(f"max_chars must be an integer >= {MIN_CHARS}, got {max_chars!r}")
    if not is_int(max_tokens) or max_tokens < MIN_TOKENS:
        raise ValueError(f"max_tokens must be an integer >= {MIN_TOKENS}, got {max_tokens!r}")
    if not is_int(warmup) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if isinstance(categories, str) or not categories:
        raise ValueError(f"categories must be a non-empty list of {', '.join(CATEGORIES)}, got {categories!r}")
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown or len(set(categories)) != len(categories):
        raise ValueError(f"categories must be distinct names among {', '.join(CATEGORIES)}, got {list(categories)!r}")


def _load_tokenizer(tokenizer: str | Path):
    """A `tokenizers.Tokenizer` from a tokenizer.json file or a directory holding one."""
    path = Path(tokenizer)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"tokenizer: no tokenizer.json at {path}")
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - tokenizers is a demo requirement
        raise ValueError(f"tokenizer: a token window needs the `tokenizers` package ({exc})") from None
    return Tokenizer.from_file(str(path))


def _token_cutter(tok, max_tokens: int) -> Callable[[str], str]:
    """Cut a text to at most `max_tokens` tokens of `tok`, back to a whitespace boundary when that
    keeps three quarters of them."""
    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    def cut(text: str) -> str:
        while text and count(text) > max_tokens:
            enc = tok.encode(text, add_special_tokens=False)
            end = enc.offsets[max_tokens - 1][1]
            end = min(end, len(text) - 1)  # always shrink
            head = text[:end]
            ws = max(head.rfind(" "), head.rfind("\n"))
            text = (head[:ws] if ws > 0 and count(head[:ws]) >= max_tokens * 3 // 4 else head).rstrip()
        return text

    cut.count = count  # type: ignore[attr-defined]
    return cut


def demo_prompts(per_category: int = DEFAULT_PER_CATEGORY, seed: int = 0, max_chars: int = DEFAULT_MAX_CHARS,
                 categories: Sequence[str] = CATEGORIES, warmup: int = 0, tokenizer: str | Path | None = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS) -> list[dict[str, str]]:
    """The records `write_demo_dataset` writes, in file order: `warmup` warmup prompts then
    `per_category` prompts of each of `categories`, both round-robin over the categories in
    sorted order; each `{"prompt", "category", "source"}` (source: the file, or
    `generated:json|csv:SEED:N`). Windows of at most `max_chars` characters, or with `tokenizer`
    (a tokenizer.json or a model directory) at most `max_tokens` of its tokens (module
    docstring). Raises ValueError for a bad argument, DemoPromptError when a category cannot be
    filled (module docstring)."""
    _check_args(per_category, seed, max_chars, categories, warmup, max_tokens)
    cats = sorted(categories)
    n_warm = {c: warmup // len(cats) + (1 if i < warmup % len(cats) else 0) for i, c in enumerate(cats)}
    corpus = "\n".join(_read(p) for p in training_files())
    if tokenizer is not None:
        cutter = _token_cutter(_load_tokenizer(tokenizer), max_tokens)
        max_chars = max(max_chars, 8 * max_tokens)  # the raw window, before the token cut

        def accept(text: str) -> bool:
            return cutter.count(text) >= max_tokens // 2 and text not in corpus  # type: ignore[attr-defined]
    else:
        min_len = max_chars // 2

        def cutter(text: str) -> str:
            return text

        def accept(text: str) -> bool:
            return len(text) >= min_len and text not in corpus

    def extract_with(fn: Callable[[Path, random.Random], str | None]) -> Callable[[Path, random.Random], str | None]:
        def extract(p: Path, r: random.Random) -> str | None:
            text = fn(p, r)
            return cutter(text) if text else text
        return extract

    paragraphs: dict[Path, list[str]] = {}

    def prose(p: Path, r: random.Random) -> str | None:
        if p not in paragraphs:
            paragraphs[p] = _paragraphs(_read(p))
        return _prose_window(paragraphs[p], r, max_chars)

    picked: dict[str, list[tuple[str, str]]] = {}
    for cat in cats:
        n = per_category + n_warm[cat]
        rng = _rng(seed, cat)
        if cat == "code":
            groups = _code_groups()
            picked[cat] = _fill(cat, groups, extract_with(lambda p, r: _code_window(_read(p), r, max_chars)), n, rng,
                                accept,
                                f"{_stdlib_dir()} (minus the training corpus) and site-packages")
        elif cat == "prose":
            picked[cat] = _fill(cat, _prose_groups(), extract_with(prose), n, rng, accept,
                                "/usr/share/common-licenses, the standard library's LICENSE.txt, "
                                "/usr/share/doc/*/copyright and site-packages *.dist-info")
        else:
            rows = []
            for i in range(n):
                kind = "json" if i % 2 == 0 else "csv"
                text = cutter(_window(_structured_text(rng, i, max_chars), max_chars))
                rows.append((f"generated:{kind}:{seed}:{i}", text))
            picked[cat] = rows
    records: list[dict[str, str]] = []
    for part, count in (("warmup", max(n_warm.values())), ("measured", per_category)):
        for i in range(count):
            for cat in cats:
                offset = 0 if part == "warmup" else n_warm[cat]
                if part == "warmup" and i >= n_warm[cat]:
                    continue
                source, text = picked[cat][offset + i]
                records.append({"prompt": text, "category": cat, "source": source})
    return records


def write_demo_dataset(path: str | Path, per_category: int = DEFAULT_PER_CATEGORY, seed: int = 0,
                       max_chars: int = DEFAULT_MAX_CHARS, categories: Sequence[str] = CATEGORIES,
                       warmup: int = 0, tokenizer: str | Path | None = None,
                       max_tokens: int = DEFAULT_MAX_TOKENS) -> Path:
    """Write the demo's categorized prompts (`demo_prompts`, same arguments) to `path` as JSON lines, the
    `jsonl` dataset kind of benchkit.measure.datasets; returns the path. The parent directory is
    created; the file is replaced atomically, its bytes the same for the same arguments on the
    same machine. Raises ValueError for a bad argument, DemoPromptError when a category cannot be
    filled."""
    records = demo_prompts(per_category, seed, max_chars, categories, warmup, tokenizer, max_tokens)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, out)
    return out
