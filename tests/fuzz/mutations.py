"""Mutations a careless or hostile user makes to a scenario and the files it names: fields deleted, wrong types,
zero/negative/huge/non-finite numbers, unknown names and keys, YAML anchors, aliases and nesting, unicode,
malformed traces and model configs. Each case records what it changed, and whether a non-finite number stands in it."""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import dataclass, field

import yaml

from servesim.workloads import servegen, tables, traces
from tests.fuzz.bases import SCENARIO_FILE, Base

#: The CSV columns some trace loader reads: a number in any other column (the arXiv table's pd_ratio) is not input
#: servesim uses, so a non-finite one there need not be refused.
READ_COLUMNS = frozenset(
    name
    for names in (
        traces.AZURE_COLUMNS,
        traces.MOONCAKE_COLUMNS,
        traces.SHAREGPT_COLUMNS,
        traces.ARXIV_COLUMNS,
        traces.BURSTGPT_COLUMNS,
        traces.SERVESIM_COLUMNS,
        tables.LENGTH_COLUMNS,
        servegen.TRACE_COLUMNS,
    )
    for name in names
)

NON_FINITE = (math.nan, math.inf, -math.inf)
NUMBERS = (
    0,
    -1,
    -0.5,
    1e-12,
    0.5,
    3.7,
    1,
    2,
    7,
    1000,
    2**31,
    2**40,
    2**40 + 1,
    2**53 + 1,
    2**63,
    2**64 + 3,
    10**20,
    1e30,
    1e308,
    -1e30,
    -(2**63),
)
WRONG_TYPES = (True, False, None, "abc", "", [], {}, [1, 2], {"a": 1}, "1e3", "12 tokens", "½")
STRINGS = (
    "bogus",
    "ñandú 😀",
    "\u202e\u0000x",
    "x" * 3000,
    "../../../etc/passwd",
    "/dev/zero",
    "/proc/self/mem",
    "VLLM",
    " vllm",
    "h100",
    "traces",
    ".",
    "~/nope.csv",
    "con:",
    "*",
)


@dataclass
class Case:
    """A scenario text and its files, and what was done to them."""

    base: str
    text: str
    files: dict[str, bytes]
    changes: list[str] = field(default_factory=list)
    non_finite: bool = False  # in the scenario, model config or GPU file: must be refused
    trace_non_finite: bool = False  # in a trace: must be refused, or its row dropped with a note
    argv: list[str] | None = None  # a command line of its own (memory, roofline); None: simulate the scenario


def mutate(base: Base, donors: list[Base], rng: random.Random) -> Case:
    """One to three mutations of `base`; `donors` lend sections, so features meet that no bundled scenario joins."""
    doc, files = copy.deepcopy(base.doc), dict(base.files)
    case = Case(base.name, "", files)
    text_mutations = []
    non_finite_files = set()  # count only if the scenario still reads them when all mutations are done
    for _ in range(rng.choice((1, 1, 2, 3))):
        kind = rng.choices(list(MUTATORS) + ["yaml_text", "file"], weights=[6, 12, 3, 2, 3, 3, 3, 4])[0]
        if kind == "yaml_text":
            text_mutations.append(rng.choice(TEXT_MUTATORS))
        elif kind == "file" and files:
            name = rng.choice(sorted(files))
            files[name], change, non_finite = mutate_file(name, files[name], rng)
            case.changes.append(f"{name}: {change}")
            if non_finite:
                non_finite_files.add(name)
        elif kind in MUTATORS:
            change = MUTATORS[kind](doc, rng, donors)
            if change:
                case.changes.append(change)
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=200)
    for text_mutation in text_mutations:
        text, change = text_mutation(text, rng)
        case.changes.append(change)
    case.text = text
    case.non_finite |= _has_non_finite(_safe_parse(text))
    for name in non_finite_files & {name for name in files if name in text}:
        if name.startswith("trace_"):
            case.trace_non_finite = True
        else:
            case.non_finite = True
    return case


OPTION_VALUES = (
    "0",
    "-1",
    "1",
    "2",
    "3",
    "8",
    "0.5",
    "1e30",
    "99999999999999999999",
    "nan",
    "inf",
    "-inf",
    "",
    "abc",
    "ñ",
    "bf16",
    "fp8",
    "fp4",
    "auto",
    "vllm",
    "sglang",
    "h100-sxm",
    "b200",
    "default",
)
VALID = {
    "--tp": ("1", "2", "4", "8"),
    "--pp": ("1", "2"),
    "--engine": ("vllm", "sglang"),
    "--gpu-memory-utilization": ("0.9", "0.5"),
    "--kv-dtype": ("bf16", "fp8"),
    "--weight-dtype": ("auto", "bf16", "fp8", "mxfp4", "nvfp4"),
    "--max-model-len": ("4096", "131072"),
    "--block-size": ("16", "32", "64"),
    "--max-num-batched-tokens": ("2048", "8192"),
    "--max-num-seqs": ("64", "256"),
    "--batch": ("1", "64", "1024"),
    "--context": ("0", "1024", "100000"),
    "--prefill": ("1", "512", "8192"),
    "--profile": ("measured", "published-fit", "vllm-published"),
}
COMMAND_OPTIONS = {
    "memory": (
        "--tp",
        "--pp",
        "--engine",
        "--gpu-memory-utilization",
        "--kv-dtype",
        "--weight-dtype",
        "--max-model-len",
        "--block-size",
        "--max-num-batched-tokens",
        "--max-num-seqs",
    ),
    "roofline": (
        "--batch",
        "--context",
        "--prefill",
        "--tp",
        "--pp",
        "--kv-dtype",
        "--weight-dtype",
        "--profile",
    ),
}
MODELS = (
    "llama-3.1-8b",
    "llama-3.1-70b",
    "deepseek-v3",
    "gpt-oss-120b",
    "gemma-3n-e2b",
    "qwen3-30b-a3b",
    "llama-9",
    "",
    "/dev/null",
)


def command_case(rng: random.Random) -> Case:
    """`memory` or `roofline` with a model, a GPU and up to four options, each value valid or not."""
    command = rng.choice(sorted(COMMAND_OPTIONS))
    argv = [command, rng.choice(MODELS), "--gpu", rng.choice(("h100-sxm", "h200", "l4", "b200", "bogus"))]
    options = rng.sample(COMMAND_OPTIONS[command], rng.randint(1, 4))
    for option in options:
        argv += [option, rng.choice(OPTION_VALUES if rng.random() < 0.25 else VALID[option])]
    non_finite = any(value.lower() in ("nan", "inf", "-inf") for value in argv)
    return Case(command, "", {}, [" ".join(argv)], non_finite=non_finite, argv=argv)


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    """Every key path into a document (dict keys and list indexes)."""
    found = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        found.append(prefix + (key,))
        found += _paths(value, prefix + (key,))
    return found


def _get(doc: object, path: tuple) -> object:
    for key in path:
        doc = doc[key]
    return doc


def _label(path: tuple) -> str:
    return ".".join(str(key) for key in path)


def _delete(doc: dict, rng: random.Random, donors: list[Base]) -> str | None:
    paths = _paths(doc)
    if not paths:
        return None
    path = rng.choice(paths)
    del _get(doc, path[:-1])[path[-1]]
    return f"deleted {_label(path)}"


def _replace(doc: dict, rng: random.Random, donors: list[Base]) -> str | None:
    """A leaf (or now and then a whole section) replaced by a number, a wrong type or an odd string."""
    paths = [p for p in _paths(doc) if rng.random() < 0.15 or not isinstance(_get(doc, p), (dict, list))]
    if not paths:
        return None
    path = rng.choice(paths)
    old = _get(doc, path)
    pool = rng.choices(
        (NUMBERS, NON_FINITE, WRONG_TYPES, STRINGS),
        weights=(6, 2, 2, 1) if isinstance(old, (int, float)) else (2, 1, 2, 3),
    )[0]
    new = copy.deepcopy(rng.choice(pool))
    _get(doc, path[:-1])[path[-1]] = new
    return f"{_label(path)}: {old!r:.40} -> {new!r:.40}"


RUN_LENGTH = ("num_requests", "duration_s")  # only scaled down: a run asked to be long is no hang


def _scale(doc: dict, rng: random.Random, donors: list[Base]) -> str | None:
    """A number made much smaller or larger, keeping its type: extreme but often valid settings."""
    paths = [
        p
        for p in _paths(doc)
        if isinstance(_get(doc, p), (int, float)) and not isinstance(_get(doc, p), bool)
    ]
    if not paths:
        return None
    path = rng.choice(paths)
    old = _get(doc, path)
    factor = rng.choice((1e-6, 1e-3, 0.1) if path[-1] in RUN_LENGTH else (1e-6, 1e-3, 0.1, 10, 1000, 1e6))
    new = type(old)(old * factor) if isinstance(old, float) else max(int(old * factor), 0)
    _get(doc, path[:-1])[path[-1]] = new
    return f"{_label(path)}: {old!r} x {factor:g} -> {new!r}"


def _unknown_key(doc: dict, rng: random.Random, donors: list[Base]) -> str | None:
    sections = [()] + [p for p in _paths(doc) if isinstance(_get(doc, p), dict)]
    path = rng.choice(sections)
    section = _get(doc, path)
    key = rng.choice(
        ["bogus_key", "max_num_seq", "Rate_per_s", "ñ", "1"] + [k[:-1] for k in section if len(k) > 2]
    )
    section[key] = rng.choice((1, "x", True))
    return f"unknown key {_label(path + (key,))}"


def _enum(doc: dict, rng: random.Random, donors: list[Base]) -> str | None:
    paths = [p for p in _paths(doc) if isinstance(_get(doc, p), str)]
    if not paths:
        return None
    path = rng.choice(paths)
    old = _get(doc, path)
    new = rng.choice(("bogus", old.upper(), old + " ", old[:-1], ""))
    _get(doc, path[:-1])[path[-1]] = new
    return f"{_label(path)}: {old!r:.40} -> {new!r:.40}"


def _graft(doc: dict, rng: random.Random, donors: list[Base]) -> str | None:
    """A section of another scenario put into this one (features that no bundled scenario joins)."""
    donor = rng.choice(donors)
    paths = [p for p in _paths(donor.doc) if isinstance(_get(donor.doc, p), dict) and isinstance(p[-1], str)]
    if not paths:
        return None
    path = rng.choice(paths)
    target = doc
    for key in path[:-1]:
        if not isinstance(target, dict) or not isinstance(target.get(key), dict):
            return None
        target = target[key]
    target[path[-1]] = copy.deepcopy(_get(donor.doc, path))
    return f"{_label(path)} from {donor.name}"


MUTATORS = {
    "delete": _delete,
    "replace": _replace,
    "scale": _scale,
    "unknown_key": _unknown_key,
    "enum": _enum,
    "graft": _graft,
}


def _alias_bomb(text: str, rng: random.Random) -> tuple[str, str]:
    lines = ["bomb0: &b0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"bomb{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, rng.choice((3, 9)))]
    return "\n".join(lines) + "\n" + text, f"alias bomb of {len(lines)} levels"


def _deep_nesting(text: str, rng: random.Random) -> tuple[str, str]:
    depth = rng.choice((30, 70, 5000))
    return text + "deep: " + "[" * depth + "]" * depth + "\n", f"nesting {depth} deep"


def _non_string_key(text: str, rng: random.Random) -> tuple[str, str]:
    key = rng.choice(("1", "on", "null", "2.5", "[1, 2]", "? {a: 1}"))
    return text + (f"{key}: x\n" if not key.startswith("?") else f"{key}\n: x\n"), f"key {key}"


def _duplicate_key(text: str, rng: random.Random) -> tuple[str, str]:
    lines = text.splitlines()
    top = [line for line in lines if line and not line[0].isspace() and ":" in line]
    return text + top[-1] + "\n" if top else text, "duplicate top-level key"


def _anchors(text: str, rng: random.Random) -> tuple[str, str]:
    """Valid YAML reuse: a section anchored and merged back elsewhere."""
    return "shared: &shared {max_model_len: 4096}\n" + text + "extra: *shared\n", "anchor and alias"


def _truncate(text: str, rng: random.Random) -> tuple[str, str]:
    cut = rng.randrange(len(text)) if text else 0
    return text[:cut], f"cut at character {cut}"


def _garbage(text: str, rng: random.Random) -> tuple[str, str]:
    junk = rng.choice(
        (
            "\t",
            "\ufeff",
            "!!python/object/apply:os.system ['true']",
            "%YAML 9.9\n",
            "\udcff",
            "--- \n--- \n",
            "{",
            "key: 'unterminated\n",
            "! foo\n",
            "!!binary AAAA\n",
        )
    )
    at = rng.randrange(len(text) + 1)
    return text[:at] + junk + text[at:], f"inserted {junk!r:.30} at {at}"


TEXT_MUTATORS = (_alias_bomb, _deep_nesting, _non_string_key, _duplicate_key, _anchors, _truncate, _garbage)


def mutate_file(name: str, data: bytes, rng: random.Random) -> tuple[bytes, str, bool]:
    """A trace, model config or GPU file mutated: (new bytes, what changed, whether a non-finite number stands)."""
    if name.endswith(".json") and not name.startswith("trace_"):
        return _mutate_json_doc(data, rng)
    if name.endswith(".yaml"):
        doc = yaml.safe_load(data)
        change = rng.choice((_replace, _replace, _delete, _unknown_key, _scale))(doc, rng, [])
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
        return text.encode(), change or "unchanged", _has_non_finite(doc)
    return _mutate_trace(name, data, rng)


def _mutate_json_doc(data: bytes, rng: random.Random) -> tuple[bytes, str, bool]:
    doc = json.loads(data)
    change = rng.choice((_replace, _replace, _replace, _delete, _scale))(doc, rng, [])
    return json.dumps(doc).encode(), change or "unchanged", _has_non_finite(doc)


def _mutate_trace(name: str, data: bytes, rng: random.Random) -> tuple[bytes, str, bool]:
    lines = data.decode("utf-8", "surrogateescape").splitlines()
    if not lines:
        return b"1,2\n", "an empty file given one row", False
    kind = rng.choice(
        ("cell", "cell", "cell", "empty", "header_only", "shuffle", "drop_column", "junk", "cut")
    )
    if kind == "empty":
        return b"", "emptied", False
    if kind == "header_only":
        return _joined(lines[:1]), "header only", False
    if kind == "junk":
        return bytes(rng.randrange(256) for _ in range(200)), "random bytes", False
    if kind == "cut":
        text = "\n".join(lines)
        return _joined([text[: rng.randrange(len(text))]])[:-1], "cut mid-file", False
    if kind == "shuffle":
        body = lines[1:] if not name.endswith(".jsonl") else lines
        rng.shuffle(body)
        return _joined(([lines[0]] if not name.endswith(".jsonl") else []) + body), "rows shuffled", False
    if name.endswith(".jsonl"):
        return _mutate_jsonl(lines, kind, rng)
    rows = [line.split(",") for line in lines]
    column = rng.randrange(len(rows[0]))
    if kind == "drop_column":
        rows = [row[:column] + row[column + 1 :] for row in rows]
        return _joined(",".join(row) for row in rows), f"column {column} dropped", False
    row = rng.randrange(1, len(rows)) if len(rows) > 1 else 0
    value = rng.choice(
        ("-5", "0", "nan", "inf", "-inf", "1e30", "", "abc", str(2**64), "3.5", "1e400", "NaT")
    )
    if column < len(rows[row]):
        rows[row][column] = value
    read = row > 0 and rows[0][column].strip() in READ_COLUMNS
    non_finite = read and value.lower() in ("nan", "inf", "-inf", "1e400")
    return _joined(",".join(r) for r in rows), f"row {row} column {column} = {value!r}", non_finite


def _joined(lines) -> bytes:
    """Lines back to a file's bytes, undecodable bytes kept as they were read."""
    return ("\n".join(lines) + "\n").encode(errors="surrogateescape")


def _mutate_jsonl(lines: list[str], kind: str, rng: random.Random) -> tuple[bytes, str, bool]:
    row = rng.randrange(len(lines))
    try:
        record = json.loads(lines[row])
    except ValueError:
        record = None
    if not isinstance(record, dict) or not record:
        return "\n".join(lines[:row]).encode(errors="surrogateescape"), f"rows from {row} dropped", False
    key = rng.choice(sorted(record))
    if kind == "drop_column":
        del record[key]
        change = f"row {row}: {key} deleted"
    else:
        record[key] = copy.deepcopy(rng.choice(NUMBERS + NON_FINITE + WRONG_TYPES))
        change = f"row {row}: {key} = {record[key]!r:.30}"
    lines[row] = json.dumps(record)
    return ("\n".join(lines) + "\n").encode(), change, _has_non_finite(record)


def _safe_parse(text: str) -> object:
    try:
        return yaml.safe_load(text)
    except Exception:  # noqa: BLE001 (a text the mutations broke on purpose)
        return None


def _has_non_finite(node: object, seen: set[int] | None = None) -> bool:
    """Whether a non-finite float stands anywhere in a parsed document (each shared alias looked at once)."""
    if isinstance(node, float):
        return not math.isfinite(node)
    if not isinstance(node, (dict, list)):
        return False
    seen = set() if seen is None else seen
    if id(node) in seen:
        return False
    seen.add(id(node))
    values = node.values() if isinstance(node, dict) else node
    return any(_has_non_finite(v, seen) for v in values)


__all__ = ["Case", "mutate", "SCENARIO_FILE"]
