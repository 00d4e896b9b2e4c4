"""Input mutators for the fuzz checks of issue 16 (tests/test_fuzz_inputs.py, benchmarks/fuzz_inputs.py).

Every mutator is a pure function ``(rng, valid input) -> mutated input`` driven by a
``random.Random``: hypothesis hands the test a controlled one (``st.randoms()``), the
benchmark a seeded one, so both share these and stay reproducible. They mutate text as
bytes (flips, non-UTF-8 bytes, truncation, duplicated lines), numbers (huge, negative,
nan, inf, 1e400, 400- and 5,000-digit integers), structure (strings replaced by lists or
mappings, deep nesting, YAML alias bombs, duplicated keys), CSV shape (columns removed or
added, fields over the csv module's 128 KiB limit) and command lines (option values
replaced by bad ones).
"""

from __future__ import annotations

import json
import math
import random
import re
from typing import Any

import yaml

BIG_DIGITS = "1" + "0" * 399  # a 400-digit integer: no float holds it
HUGE_DIGITS = "9" * 5000  # past Python's 4,300-digit int() limit
OVERSIZE = 130 * 1024  # past the csv module's default field limit (128 KiB)

# number-like text that must never be taken as an ordinary value
BAD_NUMBERS = ["-1", "0", "-0", "1e400", "-1e400", "1e-400", "1e308", BIG_DIGITS, "-" + BIG_DIGITS, HUGE_DIGITS,
               "1.5", "0x10", "1_000", "+5", "\u0661\u0662", "9" * 30, "2e9", "1e300",
               # the loaders' own bounds: accepted, and the planner and simulator must cope with them
               "1e-6", "1e6", "60000", "1000000", "1024", "1048576", "1000000000000", "16777216", "1e11", "99.999"]
YAML_NUMBERS = BAD_NUMBERS + [".nan", ".NaN", ".inf", "-.inf", "nan", "inf", "~", "null", "true", "0o17", "1:30"]
JSON_NUMBERS = [n for n in BAD_NUMBERS if re.fullmatch(r"-?[0-9.e+-]+", n) and not n.startswith("+")] + \
    ["NaN", "Infinity", "-Infinity", "null", "true", '"1"', "[]", "{}", "1.0e+400"]
CSV_VALUES = BAD_NUMBERS + ["nan", "NaN", "inf", "-inf", "Infinity", "", " ", "none", "null", "NaT", "abc",
                            '"1"', "1,2", "\u00e9", "2023-02-30 00:00:00", "9999-12-31 23:59:59", "0001-01-01",
                            "2023-03-01T00:00:00+25:00"]
# odd scalars and values of the wrong kind, as YAML text
YAML_ODD = ["[a, b]", "{x: 1}", "[]", "{}", "''", "~", "!!binary aGVsbG8=", "2001-12-14", "!!set {a, b}",
            "!!python/object/apply:os.system [echo hi]", "!!python/name:os.system", "*undefined", "&x [*x]",
            "yes", "0b101", "'\\x00'", "\"\\u0000\"", "\"\\udcff\"", "'" + "x" * 5000 + "'"]


def laughs(levels: int = 9, width: int = 10, word: str = "lol") -> str:
    """A billion-laughs alias bomb as one YAML flow value: ``width ** levels`` leaves."""
    parts = [f"&a0 [{', '.join([word] * width)}]"]
    parts += [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def nested(depth: int, kind: str = "[") -> str:
    """A value nested ``depth`` deep: lists (``[``) or one-key mappings (``{``); YAML and JSON both read it."""
    if kind == "[":
        return "[" * depth + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


# ---------------------------------------------------------------- bytes and lines

def flip_byte(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return b"\xff"
    i = rng.randrange(len(data))
    return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]


def insert_bytes(rng: random.Random, data: bytes) -> bytes:
    junk = rng.choice([b"\xe9", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\r", b"\x0c", b"\xef\xbb\xbf",
                       b"\xe2\x80\xa8", b"\x1b[2J", b"\t", b'"', b"'", b"#", b"\\"])
    i = rng.randrange(len(data) + 1)
    return data[:i] + junk + data[i:]


def latin1_comment(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    i = rng.randrange(len(lines) + 1)
    return b"\n".join(lines[:i] + [b"# caf\xe9 cr\xe8me"] + lines[i:])


def truncate(rng: random.Random, data: bytes) -> bytes:
    return data[:rng.randrange(len(data) + 1)]


def _lines_op(rng: random.Random, data: bytes, op: str) -> bytes:
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    if op == "dup":
        lines.insert(i, lines[i])
    elif op == "del":
        del lines[i]
    elif op == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "crlf":
        return data.replace(b"\n", b"\r\n" if rng.random() < 0.5 else b"\r")
    return b"\n".join(lines)


def byte_mutation(rng: random.Random, data: bytes) -> bytes:
    """One text-agnostic mutation."""
    op = rng.choice(["flip", "insert", "latin1", "truncate", "dup", "del", "swap", "crlf", "bom"])
    if op == "flip":
        return flip_byte(rng, data)
    if op == "insert":
        return insert_bytes(rng, data)
    if op == "latin1":
        return latin1_comment(rng, data)
    if op == "truncate":
        return truncate(rng, data)
    if op == "bom":
        return b"\xef\xbb\xbf" + data
    return _lines_op(rng, data, op)


# ---------------------------------------------------------------- structured data (YAML and JSON share it)

class Pairs(list):
    """A mapping kept as (key, value) pairs, so a mutation can repeat a key."""


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, Pairs):
        for i, (_, v) in enumerate(value):
            out += _paths(v, prefix + (i,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _get(value: Any, path: tuple) -> Any:
    for i in path:
        value = value[i][1] if isinstance(value, Pairs) else value[i]
    return value


def _set(root: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    parent = _get(root, path[:-1])
    i = path[-1]
    if isinstance(parent, Pairs):
        parent[i] = (parent[i][0], new)
    else:
        parent[i] = new
    return root


ODD_VALUES: list[Any] = [-1, 0, -0.0, 10**400, -(10**400), 1e308, 1e-300, math.nan, math.inf, -math.inf, True, None,
                         "", "x" * 5000, ["a"], Pairs([("x", 1)]), [], Pairs(), 1.5, 2**63, "../../x", "oregon",
                         "a100-80gb", 8, "\u00e9\u0000"]


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def structure_mutation(rng: random.Random, data: Any) -> Any:
    """One mutation of parsed data (mappings as :class:`Pairs`); ``data`` is changed in place."""
    path = rng.choice(_paths(data))
    here = _get(data, path)
    op = rng.choice(["replace", "replace", "replace", "wrap", "deep", "drop", "dupkey", "extra", "dupitem",
                     "similar"])
    if op == "replace":
        return _set(data, path, rng.choice(ODD_VALUES))
    if op == "wrap":  # a string or number replaced by a list or a mapping holding it
        return _set(data, path, [here] if rng.random() < 0.5 else Pairs([("value", here)]))
    if op == "deep":
        return _set(data, path, _deep(rng.choice([33, 100, 500])))
    if op == "similar" and isinstance(here, (int, float)) and not isinstance(here, bool):
        return _set(data, path, rng.choice([here * 1000, -here, here + 0.5, here * 1e300, 0, here / 1e9]))
    if isinstance(here, Pairs) and here:
        i = rng.randrange(len(here))
        if op == "drop":
            del here[i]
        elif op == "dupkey":  # the same key again, with another value
            here.insert(rng.randrange(len(here) + 1), (here[i][0], rng.choice(ODD_VALUES[:12] + [here[i][1]])))
        elif op == "extra":
            key = rng.choice(["bogus", "nodes", "a", "paths", "", "1", "oregon->mars", "oregon->oregon", "->",
                              "tokyo+tokyo", "a100-80gb", "h100", "jobid", "attempts", "topology"])
            here.append((key, rng.choice(ODD_VALUES)))
        return data
    if isinstance(here, list) and here:
        i = rng.randrange(len(here))
        if op == "drop":
            del here[i]
        elif op == "dupitem":
            here.insert(i, here[i])
        else:
            here.append(rng.choice(ODD_VALUES))
        return data
    return _set(data, path, rng.choice(ODD_VALUES))


def _pairs_from_yaml(value: Any) -> Any:
    if isinstance(value, dict):
        return Pairs((k, _pairs_from_yaml(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_pairs_from_yaml(v) for v in value]
    return value


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "~"
    if isinstance(value, float):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a double-quoted YAML scalar is JSON-compatible


def emit_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML of ``value`` (Pairs may repeat keys; scalars in flow/quoted form)."""
    pad = "  " * indent
    if isinstance(value, Pairs):
        if not value:
            return "{}"
        out = []
        for k, v in value:
            key = _yaml_scalar(k)
            if isinstance(v, (Pairs, list)) and v:
                out.append(f"{pad}{key}:\n{emit_yaml(v, indent + 1)}")
            else:
                out.append(f"{pad}{key}: {emit_yaml(v, 0)}")
        return "\n".join(out)
    if isinstance(value, list):
        if not value:
            return "[]"
        if len(_paths(value)) > 200 or _depth(value) > 20:  # deep nesting: flow style keeps it one line
            return json.dumps(value)
        out = []
        for v in value:
            if isinstance(v, (Pairs, list)) and v:
                inner = emit_yaml(v, indent + 1).lstrip()
                out.append(f"{pad}- {inner}")
            else:
                out.append(f"{pad}- {emit_yaml(v, 0)}")
        return "\n".join(out)
    return _yaml_scalar(value)


def _depth(value: Any) -> int:
    if isinstance(value, Pairs):
        return 1 + max((_depth(v) for _, v in value), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def emit_json(value: Any) -> str:
    """JSON of ``value`` allowing repeated keys (Pairs), NaN/Infinity and integers of any size."""
    if isinstance(value, Pairs):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {emit_json(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(emit_json(v) for v in value) + "]"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value)


# ---------------------------------------------------------------- per-format text mutators

_YAML_VALUE = re.compile(r"(?<=: )([^,{}\[\]\n#]+?)(?=\s*[,}\n#])")
_NUMBER = re.compile(r"(?<![\w.])-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?(?![\w.])")


def _replace_match(rng: random.Random, text: str, pattern: re.Pattern, choices: list[str]) -> str:
    matches = list(pattern.finditer(text))
    if not matches:
        return text + "\n" + rng.choice(choices)
    m = rng.choice(matches)
    return text[:m.start()] + rng.choice(choices) + text[m.end():]


def mutate_yaml(rng: random.Random, data: bytes) -> bytes:
    """A YAML file (a topology) mutated once, twice or three times."""
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        text = data.decode("utf-8", "surrogateescape")
        op = rng.choice(["bytes", "bytes", "number", "number", "value", "laughs", "dupkey", "structure",
                         "structure", "structure", "deep"])
        if op == "bytes":
            data = byte_mutation(rng, data)
            continue
        if op == "number":
            text = _replace_match(rng, text, _NUMBER, YAML_NUMBERS)
        elif op == "value":
            text = _replace_match(rng, text, _YAML_VALUE, YAML_ODD + YAML_NUMBERS)
        elif op == "laughs":
            text = _replace_match(rng, text, _YAML_VALUE, [laughs(rng.choice([3, 7, 9]))])
        elif op == "deep":
            text = _replace_match(rng, text, _YAML_VALUE, [nested(rng.choice([33, 100, 500]))])
        elif op == "dupkey":  # a flow mapping gets one of its keys again, with another value
            items = list(re.finditer(r"\{([^{}\n]*)\}", text))
            if items:
                m = rng.choice(items)
                key = rng.choice(re.findall(r"(\w+):", m.group(1)) or ["name"])
                extra = f", {key}: {rng.choice(['200', 'v100', 'zz', '0.5', '2'])}"
                text = text[:m.end() - 1] + extra + text[m.end() - 1:]
            else:
                text += "\nname: again\n"
        elif op == "structure":
            if "*" in text or len(text) > 100_000:  # aliases: the copy would expand them (a bomb: billions)
                data = byte_mutation(rng, data)
                continue
            try:
                text = emit_yaml(structure_mutation(rng, _pairs_from_yaml(yaml.safe_load(text)))) + "\n"
            except (yaml.YAMLError, ValueError, RecursionError):  # not YAML (any more), or nested too deep
                data = byte_mutation(rng, data)
                continue
        data = text.encode("utf-8", "surrogateescape")
    return data


def mutate_json(rng: random.Random, data: bytes, *, lines: bool = False) -> bytes:
    """A JSON file (calibration, Philly) mutated once or more; ``lines``: JSON Lines."""
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        text = data.decode("utf-8", "surrogateescape")
        op = rng.choice(["bytes", "bytes", "number", "number", "structure", "structure", "structure", "deep"])
        if op == "bytes":
            data = byte_mutation(rng, data)
            continue
        if op == "number":
            text = _replace_match(rng, text, _NUMBER, JSON_NUMBERS)
        elif op == "deep":
            depth = rng.choice([33, 100, 5000])
            text = _replace_match(rng, text, _NUMBER, ["[" * depth + "1" + "]" * depth, nested(depth, "{")])
        elif op == "structure":
            docs = text.split("\n") if lines else [text]
            i = rng.randrange(len(docs))
            try:
                docs[i] = emit_json(structure_mutation(rng, json.loads(docs[i], object_pairs_hook=Pairs)))
            except (ValueError, RecursionError):  # not JSON (any more), or nested too deep
                data = byte_mutation(rng, data)
                continue
            text = "\n".join(docs)
        data = text.encode("utf-8", "surrogateescape")
    return data


def _csv_split(text: str) -> tuple[list[str], int | None]:
    lines = text.split("\n")
    header = next((i for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#")), None)
    return lines, header


def mutate_csv(rng: random.Random, data: bytes, *, headed: bool = True) -> bytes:
    """A CSV trace mutated once or more: bytes, fields, columns, rows, oversize fields."""
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        text = data.decode("utf-8", "surrogateescape")
        lines, header = _csv_split(text)
        rows = [i for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#")
                and (i != header or not headed)]
        op = rng.choice(["bytes", "bytes", "field", "field", "field", "dropcol", "addcol", "duprow", "oversize",
                         "quote", "shortrow", "longrow"])
        if op == "bytes" or not rows:
            data = byte_mutation(rng, data)
            continue
        row = rng.choice(rows)
        cells = lines[row].split(",")
        if op == "field":
            cells[rng.randrange(len(cells))] = rng.choice(CSV_VALUES)
            lines[row] = ",".join(cells)
        elif op in ("dropcol", "addcol") and header is not None:
            col = rng.randrange(len(lines[header].split(",")))
            everywhere = rng.random() < 0.6  # else only in the header, so rows and header disagree
            for i in ([header] + rows if everywhere else [header]):
                parts = lines[i].split(",")
                if op == "dropcol" and col < len(parts):
                    del parts[col]
                elif op == "addcol":
                    name = rng.choice(["extra", parts[min(col, len(parts) - 1)], "", "priority", "deadline_s",
                                       "duration"]) if i == header else rng.choice(["1", "", "-5", "1e11"])
                    parts.insert(col, name)
                lines[i] = ",".join(parts)
        elif op == "duprow":
            lines.insert(row, lines[row])
        elif op == "oversize":
            big = "x" * OVERSIZE
            cells[rng.randrange(len(cells))] = f'"{big}"' if rng.random() < 0.3 else big
            lines[row] = ",".join(cells)
        elif op == "quote":
            i = rng.randrange(len(lines[row]) + 1)
            lines[row] = lines[row][:i] + '"' + lines[row][i:]
        elif op == "shortrow":
            lines[row] = ",".join(cells[:rng.randrange(len(cells))])
        elif op == "longrow":
            lines[row] = lines[row] + ",1" * rng.choice([1, 5, 1000])
        data = "\n".join(lines).encode("utf-8", "surrogateescape")
    return data


# ---------------------------------------------------------------- command lines

def mutate_argv(rng: random.Random, argv: list[str], bad_values: dict[str, list[str]],
                generic: list[str], keep: tuple[str, ...] = ()) -> list[str]:
    """``argv`` with one or two options spoilt: a value replaced by a bad one (the option's own
    list in ``bad_values``, else ``generic``), an option or value dropped or repeated, an
    unknown option added, the subcommand changed. Options in ``keep`` are never dropped."""
    argv = list(argv)
    for _ in range(rng.choice([1, 1, 1, 2])):
        opts = [i for i, a in enumerate(argv) if a.startswith("--")]
        valued = [i for i in opts if i + 1 < len(argv) and not argv[i + 1].startswith("--")]
        op = rng.choice(["value", "value", "value", "value", "value", "drop", "dropvalue", "repeat", "unknown",
                         "command", "stray"])
        if op == "value" and valued:
            i = rng.choice(valued)
            argv[i + 1] = rng.choice(bad_values.get(argv[i], generic))
        elif op == "drop" and [i for i in opts if argv[i] not in keep]:
            i = rng.choice([i for i in opts if argv[i] not in keep])
            del argv[i:i + (2 if i in valued else 1)]
        elif op == "dropvalue" and valued:
            del argv[rng.choice(valued) + 1]
        elif op == "repeat" and valued:
            i = rng.choice(valued)
            argv += [argv[i], rng.choice(bad_values.get(argv[i], generic))]
        elif op == "unknown":
            argv.insert(rng.randrange(1, len(argv) + 1), rng.choice(["--bogus", "-x", "--jso", "--", "-"]))
        elif op == "command":
            argv[0] = rng.choice(["", "plann", "PLAN", "simulate", "compare", "trace", "topology", "\udcff"])
        elif op == "stray":
            argv.insert(rng.randrange(1, len(argv) + 1), rng.choice(generic))
        else:
            i = rng.choice(valued) if valued else 0
            if valued:
                argv[i + 1] = rng.choice(generic)
    return argv
