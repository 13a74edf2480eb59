"""What a result format is: the interface every format module implements, and what it reads.

A format module (one per external tool's result layout: `vllm_bench.py`, `sglang_bench.py`)
defines a `ResultFormat` subclass and one instance of it named `FORMAT`; the registry
(`benchkit.formats.registry.FORMATS`) lists the instances, and detection, the importer and the
`import_results --format` choices are derived from that list. Adding a format is one module and
one registry line.

- `Source`: the path given to the import, a file or a folder. Every file a format reads goes
  through it (`json`, `read_json`, `read_bytes`, `files`): each is read once (bounded:
  `MAX_FILE_BYTES` per file, `MAX_FOLDER_FILES` per folder), and the bytes read make the
  import's idempotency key (`Source.digest`): a single file's sha256 is the sha256 of its bytes;
  a source that read several files (a folder, or a file plus a sibling such as a per-record
  export) gets one sha256 over each file's path relative to the source and its sha256.
- `ResultFormat`: `name` (the `--format` value), `tool` (what detection names), `reads` (one
  line saying which files), `takes` ("file" or "folder"), `recognise(source) -> Recognition |
  None` (the format's markers: how it tells its own files apart; never raises for a file that is
  another tool's) and `read(source) -> iterable of ImportedRun` (one or more runs, each with its
  `origin`; validates what the format requires, so a source forced as this format that is not
  one is refused, never read as runs whose figures are all unknown; raises only
  ResultFileError).
- `JsonObjectsFormat`: the base of formats whose file is one JSON object or JSON lines with one
  run per object (`vllm bench serve`, `sglang.bench_serving`): markers are top-level keys, an
  object must hold at least one of the format's figure keys, and `read_object(obj)` makes the run.

A format whose document holds several runs (GuideLLM's `benchmarks[]`), or that reads a folder
(a genai-bench experiment, a `vllm bench sweep` output), subclasses `ResultFormat` directly and
yields one ImportedRun per run, its `origin` saying where in the source the run stands
(`path#benchmarks[2]`, `folder/sub/file.json`).
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from benchkit.formats.common import ImportedRun
from benchkit.formats.errors import ResultFileError
from benchkit.formats.jsontext import JsonFile, JsonObject, read_file_bytes, read_json_objects, read_yaml_object

#: Most files a folder source lists (bounded work).
MAX_FOLDER_FILES = 10_000
#: How many keys or file names a source's description shows.
_SHOWN = 10


@dataclass(frozen=True)
class Recognition:
    """A format's answer to "did your tool write this?": `score` (how many of its markers were
    seen, > 0; the highest score wins detection), `tool` (the tool recognised, as a message
    names it: "vllm bench serve", or a variant such as "draftboard export"), `markers` (the
    markers seen, for messages)."""

    score: int
    tool: str
    markers: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Read:
    sha256: str
    size_bytes: int


class Source:
    """The path an import was given, a file or a folder, read through this object so that each
    file is read once and the import's key covers exactly the bytes read.

    `path`: as given. `is_folder`: a folder (else a file, or a path that does not exist: reading
    it raises ResultFileError "cannot read"). Errors are ResultFileError naming the file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.is_folder = self.path.is_dir()
        self._json: dict[tuple[Path, tuple], JsonFile | ResultFileError] = {}
        self._read: dict[Path, _Read] = {}
        self._files: list[Path] | None = None

    @property
    def kind(self) -> str:
        """"folder" or "file"."""
        return "folder" if self.is_folder else "file"

    def read_json(self, path: str | Path, skip_text: tuple[tuple[str, ...], ...] = ()) -> JsonFile:
        """The JSON object(s) of the file at `path` (benchkit.formats.jsontext.read_json_objects:
        one object, or JSON lines; `skip_text`: key paths the format never stores, whose text is
        not checked), read once per `skip_text` and remembered, a refusal too. Raises
        ResultFileError naming the file and line."""
        return self._cached(Path(path), ("json", tuple(skip_text)), read_json_objects)

    def read_yaml(self, path: str | Path, skip_text: tuple[tuple[str, ...], ...] = ()) -> JsonFile:
        """The YAML document of the file at `path` as one JSON object
        (benchkit.formats.jsontext.read_yaml_object), read once and remembered like `read_json`."""
        return self._cached(Path(path), ("yaml", tuple(skip_text)), read_yaml_object)

    def _cached(self, path: Path, how: tuple, reader) -> JsonFile:
        cached = self._json.get((path, how))
        if cached is None:
            try:
                cached = reader(path, how[1])
            except ResultFileError as exc:
                cached = exc
            self._json[(path, how)] = cached
        if isinstance(cached, ResultFileError):
            raise cached
        self._read[path] = _Read(cached.sha256, cached.size_bytes)
        return cached

    def json(self, skip_text: tuple[tuple[str, ...], ...] = ()) -> JsonFile:
        """The JSON of the source itself (a file source); ResultFileError for a folder."""
        if self.is_folder:
            raise ResultFileError(self.path, "is a folder, not a JSON file")
        return self.read_json(self.path, skip_text)

    def read_bytes(self, path: str | Path) -> bytes:
        """The bytes of the file at `path` (at most MAX_FILE_BYTES), for formats that are not
        JSON (YAML, CSV). Raises ResultFileError naming the file."""
        path = Path(path)
        raw = read_file_bytes(path)
        self._read[path] = _Read(hashlib.sha256(raw).hexdigest(), len(raw))
        return raw

    def files(self) -> list[Path]:
        """The regular files under a folder source, at any depth, sorted (at most
        MAX_FOLDER_FILES; hidden files and folders left out); [] for a file source. Raises
        ResultFileError when the folder cannot be listed or holds more files."""
        if not self.is_folder:
            return []
        if self._files is None:
            found: list[Path] = []
            try:
                for root, dirs, names in os.walk(self.path, onerror=_raise):
                    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                    found.extend(Path(root) / n for n in names if not n.startswith("."))
                    if len(found) > MAX_FOLDER_FILES:
                        raise ResultFileError(self.path, f"more than the {MAX_FOLDER_FILES} files one import reads")
            except OSError as exc:
                raise ResultFileError(self.path, f"cannot list the folder: {exc.strerror or exc}") from None
            self._files = sorted(p for p in found if p.is_file())
        return self._files

    def begin_read(self) -> None:
        """Forget which files were read (what was read stays cached): called once detection is
        over, so that the digest covers what the chosen format reads, not what others looked at."""
        self._read.clear()

    def digest(self) -> tuple[str, int]:
        """(sha256 hex, size in bytes) of what was read: the one file's own sha256 and size when
        only the source file was read; else the sha256 of the lines `relative path NUL sha256`
        (sorted) of every file read, and their total size. Raises RuntimeError when nothing was
        read (a format's bug: it must read what it imports through this object)."""
        if not self._read:
            raise RuntimeError(f"{self.path}: nothing was read through this Source: its format must read its files "
                               "with Source.json / read_json / read_bytes")
        if list(self._read) == [self.path]:
            one = self._read[self.path]
            return one.sha256, one.size_bytes
        base = self.path if self.is_folder else self.path.parent
        lines = sorted(f"{os.path.relpath(p, base)}\0{r.sha256}\n" for p, r in self._read.items())
        return (hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape")).hexdigest(),
                sum(r.size_bytes for r in self._read.values()))

    def describe(self) -> str:
        """What the source holds, for a message: a folder's first file names, or the top-level
        keys of a JSON file's first object (when it was read as JSON)."""
        if self.is_folder:
            names = [os.path.relpath(p, self.path) for p in self.files()]
            return f"files: {_some(names)}" if names else "no files"
        cached = next((v for (p, _), v in self._json.items() if p == self.path and isinstance(v, JsonFile)), None)
        if cached is not None and cached.objects:
            return f"keys: {_some(list(cached.objects[0].data))}"
        return ""


def _raise(exc: OSError) -> None:
    raise exc


def _some(items: list[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown + (f", ... ({len(items)} in all)" if len(items) > _SHOWN else "")


class ResultFormat(ABC):
    """One external tool's result layout (see the module docstring). Subclasses set the class
    attributes and implement `recognise` and `read`."""

    #: The `--format` value: short, lowercase, e.g. "vllm".
    name: ClassVar[str]
    #: The tool that writes the files, as detection names it, e.g. "vllm bench serve".
    tool: ClassVar[str]
    #: Which files, in one line, e.g. "JSON of --save-result / --append-result".
    reads: ClassVar[str]
    #: "file" or "folder": the kind of path the format takes.
    takes: ClassVar[str] = "file"
    #: What a run of this format must give, for the refusal of a run without any figure, e.g.
    #: "AIPerf metric tags such as time_to_first_token, request_latency".
    expected: ClassVar[str] = ""

    @abstractmethod
    def recognise(self, source: Source) -> Recognition | None:
        """A Recognition when `source` carries this format's markers, else None. May raise
        ResultFileError only when the source cannot be read at all (detection tries the other
        formats and reports that error only when none recognises the source)."""

    @abstractmethod
    def read(self, source: Source) -> Iterable[ImportedRun]:
        """Every run of `source`, in source order, each with its `origin`. Validates what this
        format requires (a source of another tool, forced as this format, is refused). Raises
        only ResultFileError (`file:line: field: reason`)."""

    def hint(self) -> str:
        """One line for the list of known formats: name, tool, what it reads."""
        return f"{self.name} ({self.tool}: {self.reads})"


class JsonObjectsFormat(ResultFormat):
    """A format whose file is one JSON object (also pretty-printed) or JSON lines, one run per
    object. Subclasses set `markers` (top-level keys that tell this tool's objects apart from
    other tools') and `figure_keys` (the keys of the figures it reads; an object needs one) and
    implement `read_object`."""

    takes: ClassVar[str] = "file"
    markers: ClassVar[frozenset[str]]
    figure_keys: ClassVar[frozenset[str]]

    @property
    def expected(self) -> str:  # type: ignore[override]
        """The figure keys a run needs one of."""
        return f"one of the keys {_some(sorted(self.figure_keys))}"

    def object_score(self, obj: JsonObject) -> int:
        """How many of this format's markers the object carries (0: not this tool's object)."""
        return len(self.markers & obj.data.keys())

    def tool_of(self, objects: list[JsonObject]) -> str:
        """The tool recognised in these objects (the format's `tool`; a variant may say more)."""
        return self.tool

    def recognise(self, source: Source) -> Recognition | None:
        """Recognised when every object carries at least one marker; the score is the fewest
        markers any object carries. Raises ResultFileError for a file that is not readable JSON."""
        if source.is_folder:
            return None
        objects = source.json().objects
        scores = [self.object_score(obj) for obj in objects]
        if not objects or min(scores) == 0:
            return None
        seen = sorted(set().union(*(self.markers & obj.data.keys() for obj in objects)))
        return Recognition(min(scores), self.tool_of(objects), tuple(seen))

    def require(self, obj: JsonObject) -> None:
        """Refuse (ResultFileError at the object) an object that holds none of `figure_keys`."""
        if not self.figure_keys & obj.data.keys():
            raise obj.error(None, f"no {self.tool} figure in this object: expected at least one of "
                                  f"{_some(sorted(self.figure_keys))}; it has {_some(list(obj.data)) or 'no key'}")

    @abstractmethod
    def read_object(self, obj: JsonObject) -> ImportedRun:
        """The run of one validated object (its `origin` is set by `read`)."""

    def read(self, source: Source) -> Iterable[ImportedRun]:
        """One run per object; origin `path:line` for JSON lines with several objects, else `path`."""
        text = source.json()
        many = len(text.objects) > 1
        for obj in text.objects:
            self.require(obj)
            run = self.read_object(obj)
            run.origin = f"{source.path}:{obj.line}" if obj.one_line and many else str(source.path)
            yield run

    def hint(self) -> str:
        return f"{super().hint()}, recognised by keys such as {_some(sorted(self.markers))}"
