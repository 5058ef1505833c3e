"""Trace loaders. Each returns the common request table of workloads/tables.py: `arrival_s` (s from the
first request; NaN without timestamps), `num_prompt_tokens`, `num_output_tokens` (int64 >= 1), sorted
by arrival, with `df.attrs["dropped"]` rows removed by cleaning. A missing file or column raises
ValueError naming the file, the missing columns and the expected ones.

Formats (see shared/data/traces/README.md for the public ones):

- azure: CSV `TIMESTAMP` ("YYYY-MM-DD HH:MM:SS.fffffff"), `ContextTokens`, `GeneratedTokens`.
- mooncake: JSONL `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (one id per 512-token
  block; shared leading ids = shared prefix). Extra column `hash_ids` (tuple[int, ...]).
- sharegpt: CSV `input_tokens`, `output_tokens` (no timestamps).
- sharegpt_json: the ShareGPT conversations JSON (`ShareGPT_V3_unfiltered_cleaned_split.json`: a list of
  `{"id", "conversations": [{"from", "value"}, ...]}`), read as `vllm bench serve --dataset-name sharegpt` reads it:
  conversations of fewer than two turns left out, the rest shuffled with Python's random seeded by
  trace.shuffle_seed (its --seed, 0; None keeps the file's order, its --disable-shuffle), each one's first turn the
  prompt and its second the completion, and pairs outside its lengths dropped (a prompt under 4 or over 1024
  tokens, a completion under 4, both over 2048; trace.length_filter false keeps them). Tokens are counted by
  trace.tokenizer, or the model's own tokenizer when it is cached (workloads/tokens.py), else estimated at
  CHARS_PER_TOKEN characters a token; a note says which.
- vllm_bench: a `vllm bench serve --save-result --save-detailed` JSON: its per-request `input_lens` and
  `output_lens`, in the order the client sent them (no timestamps: pair it with the run's arrivals).
- sglang_bench: an SGLang `bench_serving --output-file` JSONL saved with --output-details: one line's (trace.benchmark,
  default the first) per-request `input_lens` and `output_lens`, in sending order (no timestamps).
- guidellm: a GuideLLM report JSON (`guidellm benchmark --output-path report.json`): one benchmark's successful
  requests (trace.benchmark, default the first) at their send times, with their prompt and output tokens
  (workloads/guidellm.py). A report that kept a sample of the requests gives the sample, as a note says.
- arxiv: CSV `num_prefill_tokens`, `num_decode_tokens` (no timestamps).
- burstgpt: CSV `Timestamp` (s), `Model`, `Request tokens`, `Response tokens`, `Total tokens`,
  `Log Type`. Rows with 0 response tokens are failed requests (dropped by default).
- servegen: a per-client workload model folder, generated into requests by
  `servegen_requests` (workloads/servegen.py).
- servesim, servesim's own format, CSV (`.csv`) or JSON Lines (`.jsonl`/`.json`), one request per row:

  | column          | required | meaning                                                              |
  |-----------------|----------|----------------------------------------------------------------------|
  | `arrival_s`     | yes      | arrival time (s); empty in every row = no timestamps                 |
  | `prompt_tokens` | yes      | prompt length (tokens)                                               |
  | `output_tokens` | yes      | tokens to generate                                                   |
  | `session_id`    | no       | integer session (multi-turn conversation) id: a turn resending the   |
  |                 |          | session's previous prompt and answer starts with them                |
  | `priority`      | no       | integer priority, lower runs first (default 0)                       |
  | `prefix_id`     | no       | integer >= 0: rows with the same id share their first `prefix_tokens` |
  | `prefix_tokens` | with `prefix_id` | length of that shared prefix (tokens, 1..prompt_tokens)      |

  A row with an empty `prefix_id` has a fully unique prompt. One `prefix_id` must always name the
  same `prefix_tokens`.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.workloads.config import TraceSource
from servesim.workloads.guidellm import read_guidellm
from servesim.workloads.request import OUTPUT_SEGMENT_BASE
from servesim.workloads.tokens import token_counter
from servesim.workloads.servegen import servegen_requests
from servesim.workloads.tables import finish_table, require_columns, require_file

__all__ = [
    "CHARS_PER_TOKEN",
    "MOONCAKE_BLOCK_TOKENS",
    "load_arxiv",
    "load_azure",
    "load_burstgpt",
    "load_guidellm",
    "load_mooncake",
    "load_servesim",
    "load_sharegpt",
    "load_sharegpt_json",
    "load_sglang_bench",
    "load_vllm_bench",
    "load_source",
    "resolve_path",
    "servegen_requests",
]

MOONCAKE_BLOCK_TOKENS = 512
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_COLUMNS = ("timestamp", "input_length", "output_length", "hash_ids")
SHAREGPT_COLUMNS = ("input_tokens", "output_tokens")
ARXIV_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
SERVESIM_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
SERVESIM_OPTIONAL = ("session_id", "priority", "prefix_id", "prefix_tokens")
#: Characters a token, for text without its tokenizer: English prose under Llama-3's and GPT-4's tokenizers runs
#: ~4-4.5 (OpenAI's rule of thumb is 4); code and other languages run fewer, so counts come out low there.
CHARS_PER_TOKEN = 4.0


def load_azure(path: Path) -> pd.DataFrame:
    """Azure LLM inference trace 2023 (code or conv) CSV."""
    df = _read(path, "azure", AZURE_COLUMNS)
    try:
        stamps = pd.to_datetime(df["TIMESTAMP"], format="ISO8601")  # fractional seconds or none
    except (ValueError, TypeError) as err:
        why = str(err).splitlines()[0].removesuffix(" You might want to try:")
        raise ValueError(f"{path}: azure TIMESTAMP is not 'YYYY-MM-DD HH:MM:SS[.fffffff]': {why}") from None
    seconds = (stamps - stamps.min()).dt.total_seconds()
    return finish_table(path, seconds, df["ContextTokens"], df["GeneratedTokens"])


def load_mooncake(path: Path) -> pd.DataFrame:
    """Mooncake JSONL trace; adds `hash_ids` (tuple of block ids, 512 tokens per block)."""
    df = _read(path, "mooncake", MOONCAKE_COLUMNS)
    ids_ok = df["hash_ids"].map(
        lambda ids: (
            isinstance(ids, list)
            and all(
                isinstance(h, int) and not isinstance(h, bool) and 0 <= h < OUTPUT_SEGMENT_BASE for h in ids
            )
        )
    )
    if not ids_ok.all():  # negative ids and those from 2^48 up name requests' own text and outputs here
        line = int(np.flatnonzero(~ids_ok)[0])
        raise ValueError(
            f"{path}: record {line + 1}: mooncake hash_ids must be a list of integer block ids from 0 to "
            f"2^48 - 1, got {df['hash_ids'].iloc[line]!r}"
        )
    stamps = pd.to_numeric(df["timestamp"], errors="coerce")
    if stamps.isna().any():
        line = int(np.flatnonzero(stamps.isna())[0])
        raise ValueError(
            f"{path}: record {line + 1}: mooncake timestamp must be a number of milliseconds, "
            f"got {df['timestamp'].iloc[line]!r}"
        )
    length = pd.to_numeric(df["input_length"], errors="coerce")
    # cleaning drops the rest
    kept = (length >= 1) & (pd.to_numeric(df["output_length"], errors="coerce") >= 1)
    wrong = kept & (df["hash_ids"].map(len) != -(-length // MOONCAKE_BLOCK_TOKENS))  # ceil division
    if wrong.any():
        raise ValueError(
            f"{path}: {int(wrong.sum())} rows have len(hash_ids) != ceil(input_length / "
            f"{MOONCAKE_BLOCK_TOKENS}), e.g. record {int(np.flatnonzero(wrong)[0]) + 1}"
        )
    return finish_table(
        path,
        stamps / 1000.0,
        df["input_length"],
        df["output_length"],
        extra={"hash_ids": df["hash_ids"].map(tuple)},
    )


def load_sharegpt(path: Path) -> pd.DataFrame:
    """ShareGPT (input, output) length pairs; no timestamps."""
    df = _read(path, "sharegpt", SHAREGPT_COLUMNS)
    return finish_table(path, np.full(len(df), np.nan), df["input_tokens"], df["output_tokens"])


def _json(path: Path, what: str, expected: tuple[str, ...]) -> object:
    """A JSON file's document; ValueError naming the file when it is missing, unreadable or not JSON."""
    require_file(path, what, expected)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: {what} trace file cannot be read ({err.strerror})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ValueError(f"{path}: not a {what} JSON file ({str(err)[:80]})") from None


def _tokens(text: object) -> float:
    """Estimated tokens of a turn's text (NaN for a turn without text: its row is dropped)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN) if isinstance(text, str) and text else math.nan


def load_sharegpt_json(
    path: Path, tokenizer: str | None = None, shuffle_seed: int | None = 0, length_filter: bool = True
) -> pd.DataFrame:
    """The ShareGPT conversations JSON as `vllm bench serve` samples it (module docstring): first turn as prompt,
    second as completion, tokens counted by `tokenizer` (workloads/tokens.py) or estimated from the text's length."""
    data = _json(path, "sharegpt_json", ("conversations",))
    if not isinstance(data, list):
        raise ValueError(f"{path}: a ShareGPT file is a JSON list of conversations")
    entries = [entry for entry in data if _has_two_turns(entry)]
    if shuffle_seed is not None:  # vLLM: random.seed(seed); random.shuffle(data), after the same filter
        random.Random(shuffle_seed).shuffle(entries)
    pairs = [e["conversations"][:2] for e in entries if isinstance(e["conversations"], list)]
    pairs = [t for t in pairs if all(isinstance(turn, dict) for turn in t)]
    texts = [[turn.get("value") for turn in pair] for pair in pairs]
    if tokenizer is None:
        counts = [[_tokens(text) for text in pair] for pair in texts]
        note = f"token counts estimated at {CHARS_PER_TOKEN:g} characters a token (no tokenizer loaded)"
    else:
        count = token_counter(tokenizer)
        flat = count([text if isinstance(text, str) else "" for pair in texts for text in pair])
        counts = [
            [n or math.nan for n in flat[i : i + 2]] for i in range(0, len(flat), 2)
        ]  # no text: dropped
        note = f"tokens counted with {tokenizer}'s tokenizer"
    dropped = {"entries without two turns": len(data) - len(pairs)}
    if length_filter:
        kept = [pair for pair in counts if math.isnan(sum(pair)) or _vllm_samples(*pair)]
        dropped[SHAREGPT_LENGTHS] = len(counts) - len(kept)
        counts = kept
    table = finish_table(
        path,
        np.full(len(counts), np.nan),
        [prompt for prompt, _ in counts],
        [answer for _, answer in counts],
        dropped=dropped,
    )
    table.attrs["notes"] = (f"{path}: {note}",)
    return table


# vllm bench serve's is_valid_sequence for a ShareGPT pair (vllm/benchmarks/datasets.py)
SHAREGPT_MIN_TOKENS, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048
SHAREGPT_LENGTHS = (
    "pairs outside vllm bench serve's lengths (prompt 4-1024, completion 4+, total 2048 tokens)"
)


def _vllm_samples(prompt: float, completion: float) -> bool:
    """Whether `vllm bench serve` keeps a ShareGPT pair of these token counts."""
    return (
        SHAREGPT_MIN_TOKENS <= prompt <= SHAREGPT_MAX_PROMPT
        and completion >= SHAREGPT_MIN_TOKENS
        and prompt + completion <= SHAREGPT_MAX_TOTAL
    )


def _has_two_turns(entry: object) -> bool:
    """vLLM's filter before its shuffle: a `conversations` of at least two items."""
    try:
        return len(entry["conversations"]) >= 2  # type: ignore[index]
    except (TypeError, KeyError):
        return False


def load_vllm_bench(path: Path) -> pd.DataFrame:
    """A `vllm bench serve --save-detailed` result's per-request lengths, in sending order."""
    data = _json(path, "vllm_bench", ("input_lens", "output_lens"))
    return _result_lengths(path, data, "vllm bench serve --save-result --save-detailed")


def load_sglang_bench(path: Path, line: int = 0) -> pd.DataFrame:
    """One run (JSONL line) of SGLang's bench_serving output: its per-request lengths, in sending order."""
    require_file(path, "sglang_bench", ("input_lens", "output_lens"))
    try:
        lines = [text for text in path.read_text(encoding="utf-8").splitlines() if text.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: sglang_bench trace file cannot be read ({str(err)[:80]})") from None
    if line >= len(lines):
        raise ValueError(f"{path}: trace.benchmark {line}: the file has {len(lines)} run line(s)")
    try:
        data = json.loads(lines[line])
    except ValueError as err:
        raise ValueError(f"{path}:{line + 1}: not a JSON line ({str(err)[:60]})") from None
    return _result_lengths(path, data, "bench_serving --output-details")


def _result_lengths(path: Path, data: object, how: str) -> pd.DataFrame:
    """A benchmark result's `input_lens` and `output_lens` as an untimed length table."""
    lengths = [data.get(key) if isinstance(data, dict) else None for key in ("input_lens", "output_lens")]
    if not all(isinstance(column, list) for column in lengths) or len(lengths[0]) != len(lengths[1]):
        raise ValueError(
            f"{path}: no per-request input_lens and output_lens of one length; save the run with {how}"
        )
    # named by their JSON keys, their positions counted from 1 in the errors
    inputs, outputs = (
        pd.Series(column, name=key) for column, key in zip(lengths, ("input_lens", "output_lens"))
    )
    return finish_table(path, np.full(len(inputs), np.nan), inputs, outputs)


def load_guidellm(path: Path, benchmark: int = 0) -> pd.DataFrame:
    """One benchmark of a GuideLLM report: its successful requests' send times and lengths."""
    require_file(path, "guidellm", ("benchmarks",))
    benchmarks = read_guidellm(path)
    if benchmark >= len(benchmarks):
        raise ValueError(
            f"{path}: trace.benchmark {benchmark}: the report has benchmarks 0-{len(benchmarks) - 1}"
        )
    b = benchmarks[benchmark]
    table = finish_table(path, b.starts_s(), b.column("prompt_tokens"), b.column("output_tokens"))
    if b.sampled:
        table.attrs["notes"] = (
            f"{b.source}: GuideLLM kept {len(b.requests)} of its {b.total} requests; the trace holds those",
        )
    return table


def load_arxiv(path: Path) -> pd.DataFrame:
    """arXiv-summarization (prefill, decode) lengths from Vidur; no timestamps."""
    df = _read(path, "arxiv", ARXIV_COLUMNS)
    return finish_table(path, np.full(len(df), np.nan), df["num_prefill_tokens"], df["num_decode_tokens"])


def load_burstgpt(path: Path, model: str | None = None, drop_failed: bool = True) -> pd.DataFrame:
    """BurstGPT CSV, optionally only rows whose `Model` is `model`.

    Failed requests (0 response tokens) are dropped and counted, or with `drop_failed=False` kept as
    requests that generate 1 token (their prefill still costs the server).
    """
    df = _read(path, "burstgpt", BURSTGPT_COLUMNS[:4], BURSTGPT_COLUMNS)
    if model is not None:
        if not (df["Model"] == model).any():
            raise ValueError(
                f"{path}: no rows with Model == {model!r}; models present: "
                f"{sorted(df['Model'].astype(str).unique())}"
            )
        df = df[df["Model"] == model]
    failed = pd.to_numeric(df["Response tokens"], errors="coerce") == 0
    output = df["Response tokens"].where(~failed, 1)
    if drop_failed:
        df, output = df[~failed], output[~failed]
    return finish_table(
        path,
        df["Timestamp"],
        df["Request tokens"],
        output,
        dropped={
            "failed requests, 0 response tokens (drop_failed: false keeps them)": int(failed.sum())
            if drop_failed
            else 0
        },
    )


def load_servesim(path: Path) -> pd.DataFrame:
    """servesim's own CSV/JSONL format (see the module docstring)."""
    df = _read(path, "servesim", SERVESIM_COLUMNS, SERVESIM_COLUMNS + SERVESIM_OPTIONAL)
    if ("prefix_id" in df.columns) != ("prefix_tokens" in df.columns):
        raise ValueError(f"{path}: servesim columns prefix_id and prefix_tokens go together; found only one")
    extra = {c: _nullable_int(df[c], path, c) for c in SERVESIM_OPTIONAL if c in df.columns}
    if "priority" in extra:
        extra["priority"] = extra["priority"].fillna(0).astype(np.int64)
    table = finish_table(path, df["arrival_s"], df["prompt_tokens"], df["output_tokens"], extra=extra)
    if "prefix_id" in table.columns:
        _check_prefixes(table, path)
    return table


def resolve_path(path: Path, base_dir: Path) -> Path:
    """`path` itself if absolute, else relative to `base_dir` (the scenario's folder)."""
    return path if path.is_absolute() else base_dir / path


def load_source(
    src: TraceSource, base_dir: Path, rng: np.random.Generator | None = None, duration_s: float | None = None
) -> pd.DataFrame:
    """Load (or, for servegen, generate with `rng` over `duration_s` seconds) the table of `src`."""
    path = resolve_path(src.path, base_dir)
    match src.format:
        case "azure":
            return load_azure(path)
        case "mooncake":
            return load_mooncake(path)
        case "sharegpt":
            return load_sharegpt(path)
        case "sharegpt_json":
            return load_sharegpt_json(path, src.tokenizer, src.shuffle_seed, src.length_filter)
        case "vllm_bench":
            return load_vllm_bench(path)
        case "guidellm":
            return load_guidellm(path, src.benchmark)
        case "sglang_bench":
            return load_sglang_bench(path, src.benchmark)
        case "arxiv":
            return load_arxiv(path)
        case "burstgpt":
            return load_burstgpt(path, src.burstgpt_model, src.drop_failed)
        case "servesim":
            return load_servesim(path)
        case "servegen":
            if rng is None or duration_s is None:
                raise ValueError(f"{path}: servegen generates requests and needs an rng and duration_s")
            return servegen_requests(path, rng, duration_s, clients=src.clients)
    raise ValueError(f"unknown trace format {src.format!r}")


def _read(
    path: Path, fmt: str, required: tuple[str, ...], expected: tuple[str, ...] | None = None
) -> pd.DataFrame:
    """Read a CSV or JSON Lines file and check its columns."""
    require_file(path, fmt, expected or required)
    try:
        if path.suffix in (".jsonl", ".json"):
            df = pd.read_json(path, lines=True, dtype=False)
        else:
            df = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, ValueError) as err:
        raise ValueError(f"{path}: not a readable {fmt} trace ({str(err).splitlines()[0]})") from None
    except OSError as err:  # a device or a special file: /proc/self/mem gives EIO
        raise ValueError(f"{path}: {fmt} trace cannot be read ({err.strerror or err})") from None
    require_columns(df, path, fmt, required, expected)
    return df


def _nullable_int(values: pd.Series, path: Path, name: str) -> pd.Series:
    """An integer column that may have empty cells (pandas Int64)."""
    numeric = pd.to_numeric(values, errors="coerce")
    if (numeric.notna() != values.notna()).any() or (numeric.dropna() % 1 != 0).any():
        raise ValueError(f"{path}: servesim column {name} must hold integers or be empty")
    return numeric.astype("Int64")


def _check_prefixes(table: pd.DataFrame, path: Path) -> None:
    """prefix_id in 0..2^48 - 1 with a prefix_tokens in 1..prompt_tokens, the same for every row of one id."""
    has_id, has_len = table["prefix_id"].notna(), table["prefix_tokens"].notna()
    rows = table[has_id]
    problems = []
    if (has_id != has_len).any():
        problems.append("prefix_id and prefix_tokens must both be set or both empty")
    if ((rows["prefix_id"] < 0) | (rows["prefix_id"] >= OUTPUT_SEGMENT_BASE)).any():
        # the ids name the shared text's segments; from 2^48 up they are generated outputs' (workloads/request.py)
        problems.append(f"prefix_id must be in 0..{OUTPUT_SEGMENT_BASE - 1}")
    if ((rows["prefix_tokens"] < 1) | (rows["prefix_tokens"] > rows["num_prompt_tokens"])).any():
        problems.append("prefix_tokens must be in 1..prompt_tokens")
    if (rows.groupby("prefix_id")["prefix_tokens"].nunique() > 1).any():
        problems.append("one prefix_id must always have the same prefix_tokens")
    if problems:
        raise ValueError(f"{path}: servesim prefixes: " + "; ".join(problems))
