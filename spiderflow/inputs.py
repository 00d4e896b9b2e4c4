"""Reading user files safely: bytes, UTF-8, size, nesting, aliases, duplicate keys, numbers.

Every loader (topology YAML, trace CSV and public formats, calibration JSON,
rank specs) reads through here, so the same bad input gets the same one-line
:class:`ConfigError` naming the file, what is wrong and the fix, never a
traceback, a hang or a silently changed value:

- :func:`read_text`: at most ``max_bytes``; a byte that is not UTF-8 is
  reported with its offset and line.
- :func:`load_yaml`: safe YAML whose node graph is checked *before* it is
  built: nesting depth, nodes after alias expansion (a few hundred bytes of
  aliases can expand to billions of nodes), and duplicate mapping keys
  (PyYAML lets the last one win without a word).
- :func:`load_json`: duplicate keys, ``NaN``/``Infinity`` and nesting depth.
- :func:`finite`: a number a float can hold (an integer such as ``10**400``
  has no float and makes ``math.isfinite`` raise ``OverflowError``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from spiderflow.errors import ConfigError

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 32
MAX_NODES = 1_000_000  # after alias expansion
LARGEST = 1e300  # numbers beyond this are refused: they overflow as soon as they are multiplied


def read_text(path: str | Path, *, what: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The file's text; ``what`` names it in errors ("topology file")."""
    source = str(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a directory, not a {what}; give the file's path") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read {what} ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{source}: {what} is larger than {max_bytes // (1024 * 1024)} MiB; "
                          "is this the right file?")
    return decode(data, source)


def decode(data: bytes, source: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{source}: line {line}: byte 0x{data[exc.start]:02x} at offset {exc.start} is not "
                          "UTF-8; save the file as UTF-8") from None
    return text[1:] if text.startswith("\ufeff") else text


def _check_graph(node: yaml.Node, source: str) -> None:
    """Depth and expanded size of a composed YAML node graph; aliases are shared nodes here."""
    sizes: dict[int, int] = {}  # id(node) -> expanded node count, so each shared node is walked once

    def walk(n: yaml.Node, depth: int, active: frozenset) -> int:
        if depth > MAX_DEPTH:
            raise ConfigError(f"{source}: nested deeper than {MAX_DEPTH} levels; flatten the file")
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in active:
            raise ConfigError(f"{source}: line {n.start_mark.line + 1}: a YAML alias refers to itself")
        total = 1
        if isinstance(n, yaml.SequenceNode):
            children = n.value
        elif isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        else:
            children = []
        inner = active | {id(n)}
        for child in children:
            total += walk(child, depth + 1, inner)
            if total > MAX_NODES:
                raise ConfigError(f"{source}: expands to more than {MAX_NODES:,} values (YAML aliases?); "
                                  "write the values out")
        sizes[id(n)] = total
        return total

    walk(node, 0, frozenset())


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""

    source = "<yaml>"

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    raise ConfigError(f"{self.source}: line {key_node.start_mark.line + 1}: a mapping key must "
                                      f"be a plain value (got {type(key).__name__})") from None
                if key in seen:
                    raise ConfigError(f"{self.source}: line {key_node.start_mark.line + 1}: key {key!r} appears "
                                      f"twice in one mapping (first on line {seen[key]}); keep one")
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, source: str) -> Any:
    """Parse ``text`` as safe YAML with the checks above; errors name ``source`` and the line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            return None
        _check_graph(node, source)
        loader = _StrictLoader(text)
        loader.source = source
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        problem = str(getattr(exc, "problem", None) or exc).strip().splitlines()[0]  # one line, always
        raise ConfigError(f"{source}:{where} is not valid YAML ({problem})") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply; flatten the file") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError(f"{source}: is not valid YAML ({exc})") from None


def _no_duplicates(source: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError(f"{source}: key {key!r} appears twice in one object; keep one")
            out[key] = value
        return out
    return hook


def _no_constant(source: str):
    def hook(name: str):
        raise ConfigError(f"{source}: {name} is not a number JSON allows; write a finite number")
    return hook


def _finite_float(source: str):
    def hook(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ConfigError(f"{source}: {text} is too large for a number; write a finite number")
        return value
    return hook


def _json_depth(text: str) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def load_json(text: str, source: str, *, line: int | None = None) -> Any:
    """Parse ``text`` as JSON refusing duplicate keys, NaN/Infinity and deep nesting (``line``:
    the text is that line of ``source``, and errors name it)."""
    where = source if line is None else f"{source}: line {line}"
    if _json_depth(text) > MAX_DEPTH:
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels; flatten the file")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(where), parse_constant=_no_constant(where),
                          parse_float=_finite_float(where))
    except json.JSONDecodeError as exc:
        if line is None:
            raise ConfigError(f"{source}: line {exc.lineno} is not valid JSON ({exc.msg})") from None
        raise ConfigError(f"{where} is not valid JSON ({exc.msg}); fix or delete that line") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError(f"{where}: is not valid JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply; flatten the file") from None


def load_json_lines(text: str, source: str) -> list[tuple[int, dict]]:
    """The JSON objects of a JSON-lines text, each with its line number, parsed as :func:`load_json`
    parses a file (blank lines skipped); a line that is not a JSON object is refused."""
    out = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        value = load_json(line, source, line=number)
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: line {number} is not a JSON object (got {type(value).__name__})")
        out.append((number, value))
    return out


def finite(value: Any) -> bool:
    """True for an int or float (not bool) that is finite and within +-1e300."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return -LARGEST <= value <= LARGEST
    return math.isfinite(value) and abs(value) <= LARGEST
