"""Strict YAML reading for concept entries: no duplicate keys, no anchors or aliases, bounded size and depth.

`read_yaml` returns the plain data and a map from each field path to its line, so that a problem found
later (by the schema or the cross-entry checks) can still name the line it comes from.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, CollectionStartEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

try:
    from yaml._yaml import CParser  # libyaml, shipped in PyYAML's wheels
except ImportError:  # a PyYAML built without it: every file takes the pure-Python path
    CParser = None

MAX_BYTES = 256 * 1024  # entries are a few KiB; anything near this is a mistake or an attack
MAX_DEPTH = 32  # entries nest four or five levels deep

FieldPath = tuple[str | int, ...]


class YamlProblem(Exception):
    """A problem found while reading the file, with its line (1-based) when known."""

    def __init__(self, field: str, message: str, line: int | None = None):
        super().__init__(message)
        self.field, self.message, self.line = field, message, line


class _Strict:
    """The composing step of a loader, refusing anchors and aliases (so no alias bombs) and nesting deeper than
    MAX_DEPTH. Mixed into the pure-Python loader and into the faster one that reads libyaml's events."""

    _depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, AliasEvent):
            raise YamlProblem("yaml", f"expected plain data without aliases, got alias *{event.anchor}", line)
        if isinstance(event, ScalarEvent | CollectionStartEvent) and event.anchor is not None:
            raise YamlProblem("yaml", f"expected plain data without anchors, got anchor &{event.anchor}", line)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlProblem("yaml", f"expected at most {MAX_DEPTH} levels of nesting", line)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class StrictLoader(_Strict, yaml.SafeLoader):
    """PyYAML's pure-Python SafeLoader with the strict composer: the reference, and the one whose error messages
    a broken file gets."""


if CParser is not None:
    class FastStrictLoader(_Strict, Composer, CParser, SafeConstructor, Resolver):
        """The same loader on libyaml's parser (about four times faster on the entries here): libyaml scans and
        parses, PyYAML's composer (with the checks above), resolver and constructor do the rest. A file it
        cannot read is read again by StrictLoader, so errors read the same with or without libyaml."""

        def __init__(self, stream):
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            Composer.__init__(self)

    LOADERS = (StrictLoader, FastStrictLoader)
else:
    LOADERS = (StrictLoader,)


# PyYAML follows YAML 1.1 and reads 6.4e9 (no dot or no exponent sign) as text; accept it as a float.
for _loader in LOADERS:
    _loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )


def _key_text(node: Node) -> str:
    return node.value if isinstance(node, ScalarNode) else f"<{node.tag}>"


def _index_lines(node: Node, path: FieldPath, lines: dict[FieldPath, int]) -> None:
    """Record the line of every field path under `node`; reject duplicate mapping keys."""
    if isinstance(node, MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name, line = _key_text(key), key.start_mark.line + 1
            if name == "<<" and key.tag.endswith(":merge"):
                raise YamlProblem(dotted(path) or "yaml", "expected plain keys, got a merge key <<", line)
            if name in seen:
                where = dotted((*path, name))
                raise YamlProblem(where, f"expected each key once, got a second '{name}' "
                                  f"(first on line {seen[name]})", line)
            seen[name] = line
            lines[(*path, name)] = line
            _index_lines(value, (*path, name), lines)
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _index_lines(item, (*path, i), lines)


def dotted(path: FieldPath) -> str:
    """('checks', 2, 'answer') -> 'checks[2].answer'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def read_yaml(path: Path, *, libyaml: bool = True) -> tuple[object, dict[FieldPath, int]]:
    """Parse one file strictly. Raises YamlProblem (never a yaml or Unicode exception).

    libyaml=False: PyYAML's pure-Python parser only (the tests compare the two paths on every file).
    """
    try:
        size = path.stat().st_size
    except OSError as err:
        raise YamlProblem("file", f"expected a readable file, got {err.strerror or err}") from None
    if size > MAX_BYTES:
        raise YamlProblem("file", f"expected at most {MAX_BYTES // 1024} KiB, got {size / 1024:,.0f} KiB")
    with path.open("rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise YamlProblem("file", f"expected at most {MAX_BYTES // 1024} KiB, got more")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise YamlProblem("file", f"expected UTF-8 text, got byte 0x{raw[err.start]:02x} at offset {err.start}") \
            from None
    if libyaml and CParser is not None:
        try:
            yaml.reader.Reader(text)  # the printable-characters check, as the pure-Python path makes it
            return _parse(FastStrictLoader(text))
        except (yaml.YAMLError, YamlProblem, RecursionError):
            pass  # read again below, for the message the pure-Python loader gives
    try:
        loader = StrictLoader(text)
    except yaml.reader.ReaderError as err:
        line = text.count("\n", 0, err.position) + 1
        raise YamlProblem("file", f"expected printable text, got character #x{err.character:04x}", line) from None
    try:
        return _parse(loader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = (err.problem or "invalid YAML").strip()
        if err.context:
            what = f"{err.context.strip()}, {what}"
        raise YamlProblem("yaml", f"expected valid YAML, got: {what}", mark.line + 1 if mark else None) from None
    except yaml.YAMLError as err:
        raise YamlProblem("yaml", f"expected valid YAML, got: {str(err).splitlines()[0]}") from None
    except RecursionError:
        raise YamlProblem("yaml", f"expected at most {MAX_DEPTH} levels of nesting") from None


def _parse(loader) -> tuple[object, dict[FieldPath, int]]:
    """The data of the loader's one document and the line of every field path; the loader is disposed of."""
    try:
        node = loader.get_single_node()
        if node is None:
            raise YamlProblem("file", "expected a YAML mapping of entry fields, got an empty file")
        lines: dict[FieldPath, int] = {(): node.start_mark.line + 1}
        _index_lines(node, (), lines)
        return loader.construct_document(node), lines
    finally:
        loader.dispose()
