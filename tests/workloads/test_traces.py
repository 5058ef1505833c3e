"""Trace loaders on the real public files (statistics from shared/data/traces/README.md) and on
small files written here (BurstGPT, servesim, error cases)."""

import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesim.workloads.traces import (
    CHARS_PER_TOKEN,
    SHAREGPT_LENGTHS,
    load_sharegpt_json,
    load_vllm_bench,
    load_arxiv,
    load_azure,
    load_burstgpt,
    load_mooncake,
    load_servesim,
    load_sharegpt,
)

AZURE = "azure_llm_2023/AzureLLMInferenceTrace_{}.csv"


def mean_rate(df: pd.DataFrame) -> float:
    return (len(df) - 1) / (df["arrival_s"].iloc[-1] - df["arrival_s"].iloc[0])


def check_common(df: pd.DataFrame) -> None:
    assert list(df.columns[:3]) == ["arrival_s", "num_prompt_tokens", "num_output_tokens"]
    assert df["num_prompt_tokens"].dtype == np.int64 and df["num_output_tokens"].dtype == np.int64
    assert (df["num_prompt_tokens"] >= 1).all() and (df["num_output_tokens"] >= 1).all()
    if df["arrival_s"].notna().all():
        assert df["arrival_s"].iloc[0] == 0.0 and df["arrival_s"].is_monotonic_increasing


@pytest.mark.parametrize(
    "service, rows, span_s, rate, prompt_mean, output_mean",
    [
        ("conv", 19_366, 3_502, 5.53, 1_155, 211),
        ("code", 8_819, 3_436, 2.57, 2_048, 27.9),
    ],
)
def test_azure(traces_dir, service, rows, span_s, rate, prompt_mean, output_mean):
    df = load_azure(traces_dir / AZURE.format(service))
    check_common(df)
    assert len(df) == rows and df.attrs["dropped"] == 0
    assert df["arrival_s"].iloc[-1] == pytest.approx(span_s, abs=1)
    assert mean_rate(df) == pytest.approx(rate, abs=0.005)
    assert df["num_prompt_tokens"].mean() == pytest.approx(prompt_mean, rel=0.005)
    assert df["num_output_tokens"].mean() == pytest.approx(output_mean, rel=0.005)


def test_azure_keeps_sub_millisecond_timestamps(traces_dir):
    df = load_azure(traces_dir / AZURE.format("conv"))
    # 18:15:46.6805900 -> 18:15:50.9951690
    assert df["arrival_s"].iloc[1] == pytest.approx(4.314579, abs=1e-6)


def test_mooncake(traces_dir):
    df = load_mooncake(traces_dir / "mooncake_synthetic/synthetic_trace.jsonl")
    check_common(df)
    assert len(df) == 3_993
    assert mean_rate(df) == pytest.approx(3.91, abs=0.005)
    assert df["num_prompt_tokens"].mean() == pytest.approx(15_325, rel=0.001)
    assert df["num_output_tokens"].median() == 69
    assert (df["hash_ids"].map(len) == [math.ceil(n / 512) for n in df["num_prompt_tokens"]]).all()
    assert isinstance(df["hash_ids"].iloc[0], tuple)
    blocks = [h for ids in df["hash_ids"] for h in ids]
    assert len(blocks) == 121_877 and len(set(blocks)) == 43_924


def test_sharegpt(traces_dir):
    df = load_sharegpt(
        traces_dir / "sharegpt_lengths_vllm_sosp23/sharegpt_first_turn_lengths_opt_tokenizer.csv"
    )
    check_common(df)
    assert len(df) == 84_226 and df["arrival_s"].isna().all()
    assert df["num_prompt_tokens"].median() == 40 and df["num_output_tokens"].median() == 275
    assert df["num_prompt_tokens"].max() == 162_307


def test_arxiv(traces_dir):
    df = load_arxiv(
        traces_dir / "arxiv_summarization_lengths_vidur/"
        "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
    )
    check_common(df)
    assert len(df) == 28_257 and df["arrival_s"].isna().all()
    assert np.percentile(df["num_prompt_tokens"], 50) == pytest.approx(2_730, abs=1)
    assert df["num_output_tokens"].mean() == pytest.approx(291, rel=0.005)


BURSTGPT_SAMPLE = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
46,GPT-4,417,217,634,Conversation log
40,ChatGPT,22,341,363,API log
118,GPT-4,0,60,60,API log
140,ChatGPT,1131,209,1340,Conversation log
"""


@pytest.fixture
def burstgpt_csv(tmp_path: Path) -> Path:
    path = tmp_path / "BurstGPT_sample.csv"
    path.write_text(BURSTGPT_SAMPLE)
    return path


def test_burstgpt_drops_failed_and_empty_rows_and_sorts(burstgpt_csv):
    df = load_burstgpt(burstgpt_csv)
    check_common(df)
    assert df.attrs["dropped"] == 2  # one failed (0 response tokens), one with 0 request tokens
    assert df.attrs["dropped_by"] == {
        "failed requests, 0 response tokens (drop_failed: false keeps them)": 1,
        "a length missing, not a number or below 1": 1,
    }
    assert df["arrival_s"].tolist() == [0, 35, 41, 135]
    assert df["num_prompt_tokens"].tolist() == [472, 22, 417, 1131]


def test_burstgpt_model_filter_and_kept_failures(burstgpt_csv):
    chat = load_burstgpt(burstgpt_csv, model="ChatGPT", drop_failed=False)
    assert chat["num_prompt_tokens"].tolist() == [472, 22, 1087, 1131]
    assert chat["num_output_tokens"].tolist() == [18, 341, 1, 209]  # the failed one generates 1 token
    assert chat.attrs["dropped"] == 0
    assert len(load_burstgpt(burstgpt_csv, model="GPT-4")) == 1


def test_burstgpt_unknown_model_lists_the_models(burstgpt_csv):
    with pytest.raises(ValueError, match=r"GPT-5.*'ChatGPT', 'GPT-4'"):
        load_burstgpt(burstgpt_csv, model="GPT-5")


SERVESIM_COLUMNS = ["arrival_s", "prompt_tokens", "output_tokens", "session_id", "prefix_id", "prefix_tokens"]
SERVESIM_ROWS = [
    dict(zip(SERVESIM_COLUMNS, values))
    for values in [
        (10.5, 300, 20, 1, 7, 200),
        (10.0, 250, 30, None, None, None),
        (12.0, 200, 0, 2, 7, 200),  # 0 output tokens: dropped
        (13.0, 200, 5, 2, 7, 200),
    ]
]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_servesim_csv_and_jsonl_agree(tmp_path, suffix):
    path = tmp_path / f"mine{suffix}"
    frame = pd.DataFrame(SERVESIM_ROWS)
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_json(path, orient="records", lines=True)
    df = load_servesim(path)
    check_common(df)
    assert df.attrs["dropped"] == 1
    assert df["arrival_s"].tolist() == [0.0, 0.5, 3.0]
    assert df["session_id"].tolist()[1:] == [1, 2] and pd.isna(df["session_id"].iloc[0])
    assert df["prefix_id"].tolist()[1:] == [7, 7] and df["prefix_tokens"].tolist()[1:] == [200, 200]


def test_servesim_inconsistent_prefix_is_an_error(tmp_path):
    rows = [dict(SERVESIM_ROWS[0]), dict(SERVESIM_ROWS[3], prefix_tokens=150)]
    path = tmp_path / "bad.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    with pytest.raises(ValueError, match="same prefix_tokens"):
        load_servesim(path)


@pytest.mark.parametrize(
    "row, message",
    [
        ("inf,100,10", "arrival times must be finite; data rows [3] are not (e.g. inf)"),
        ("1.0,1e30,10", "prompt_tokens must be at most 2^40 tokens; data rows [3] are not (e.g. 1e+30)"),
        ("1.0,100,inf", "output_tokens must be whole token counts; data rows [3] are not (e.g. inf)"),
        ("1.0,10.5,5", "prompt_tokens must be whole token counts; data rows [3] are not (e.g. 10.5)"),
    ],
)
def test_a_value_no_request_could_have_is_named_with_its_file_and_row(tmp_path, row, message):
    """Such a value used to pass (a request finishing at infinity) or overflow int64 into a confusing message. It is
    named by the file's column and data row, counted before the row without an output (dropped) is left out."""
    path = tmp_path / "mine.csv"
    path.write_text(f"arrival_s,prompt_tokens,output_tokens\n0.0,100,0\n0.5,100,10\n{row}\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
        load_servesim(path)


def test_azure_timestamps_may_have_no_fraction_and_a_bad_one_is_named_in_one_line(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,3,4\n2023-11-16 18:15:48,5,6\n"
    )
    assert load_azure(path)["arrival_s"].tolist() == [0.0, 1.5]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,3,4\nyesterday,5,6\n")
    with pytest.raises(ValueError) as err:
        load_azure(path)
    assert str(err.value).startswith(f"{path}: azure TIMESTAMP is not 'YYYY-MM-DD HH:MM:SS[.fffffff]': ")
    assert "\n" not in str(err.value) and "yesterday" in str(err.value)


@pytest.mark.parametrize(
    "loader, expected",
    [
        (load_azure, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]),
        (load_mooncake, ["timestamp", "input_length", "output_length", "hash_ids"]),
        (load_sharegpt, ["input_tokens", "output_tokens"]),
        (load_arxiv, ["num_prefill_tokens", "num_decode_tokens"]),
        (load_burstgpt, ["Timestamp", "Model", "Request tokens", "Response tokens"]),
        (load_servesim, ["arrival_s", "prompt_tokens", "output_tokens"]),
    ],
)
def test_missing_file_names_the_file_and_columns(tmp_path, loader, expected):
    path = tmp_path / "nope.csv"
    with pytest.raises(ValueError) as err:
        loader(path)
    assert str(path) in str(err.value) and "not found" in str(err.value)
    assert "(its columns: " in str(err.value) and all(c in str(err.value) for c in expected)


def test_missing_column_names_the_file_the_missing_and_the_expected(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,Context\n2023-11-16 18:15:46.6805900,3\n")
    with pytest.raises(ValueError) as err:
        load_azure(path)
    message = str(err.value)
    assert str(path) in message
    assert (
        "azure trace lacks ContextTokens, GeneratedTokens (of TIMESTAMP, ContextTokens, GeneratedTokens); "
        "found TIMESTAMP, Context"
    ) in message


def test_mooncake_missing_hash_ids_column(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl.*trace lacks hash_ids"):
        load_mooncake(path)


def test_mooncake_block_count_mismatch_is_an_error(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1025, "output_length": 2, "hash_ids": [1, 2]}\n')
    with pytest.raises(ValueError, match="len\\(hash_ids\\)"):
        load_mooncake(path)


@pytest.mark.parametrize(
    "second, message",
    [
        (
            '{"timestamp": 5, "input_length": 10, "output_length": 2}',
            r"record 2: mooncake hash_ids must be a list of "
            r"integer block ids from 0 to 2\^48 - 1, got nan",
        ),
        (  # ids from 2^48 up name generated outputs, negative ones a request's own text
            '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [281474976710656]}',
            r"record 2: mooncake hash_ids must be a list of integer block ids from 0 to 2\^48 - 1",
        ),
        (
            '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [-1]}',
            r"record 2: mooncake hash_ids must be a list of integer block ids from 0 to 2\^48 - 1",
        ),
        (
            '{"timestamp": "5 ms", "input_length": 10, "output_length": 2, "hash_ids": [3]}',
            r"record 2: mooncake timestamp must be a number of milliseconds, got '5 ms'",
        ),
        (
            '{"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [3]}',
            r"1 rows .* e\.g\. record 2",
        ),
    ],
)
def test_a_bad_mooncake_line_is_named_with_its_field(tmp_path, second, message):
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n' + second + "\n"
    )
    with pytest.raises(ValueError, match=rf"m\.jsonl: .*{message}"):
        load_mooncake(path)


@pytest.mark.parametrize(
    "rows,problem",
    [
        ("0,100,5,,-1,10", "prefix_id must be in 0..281474976710655"),
        # an id from 2^48 up would name a request's generated output, which a later turn's prompt holds
        ("0,100,5,,281474976710656,10", "prefix_id must be in 0..281474976710655"),
        ("0,100,5,,3,", "prefix_id and prefix_tokens must both be set or both empty"),
        ("0,100,5,,3,101", "prefix_tokens must be in 1..prompt_tokens"),
        ("0,100,5,,3,10\n1,100,5,,3,20", "one prefix_id must always have the same prefix_tokens"),
    ],
)
def test_servesim_prefixes_out_of_range_are_refused_naming_the_file(tmp_path, rows, problem):
    path = tmp_path / "t.csv"
    path.write_text(",".join(SERVESIM_COLUMNS) + "\n" + rows + "\n")
    with pytest.raises(ValueError, match=rf"t\.csv: servesim prefixes: {re.escape(problem)}"):
        load_servesim(path)
    path.write_text(",".join(SERVESIM_COLUMNS) + "\n0,100,5,,281474976710655,10\n")
    assert load_servesim(path)["prefix_id"].tolist() == [281474976710655]


def test_sharegpt_json_reads_each_conversations_first_two_turns_as_text_estimates(tmp_path):
    """As vllm bench serve reads the ShareGPT file: first turn the prompt, second the completion; conversations of
    fewer than two turns, or no turns, are left out; tokens are characters / CHARS_PER_TOKEN, rounded up."""
    conversations = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "x" * 40}, {"from": "gpt", "value": "y" * 401}],
        },
        {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},
        {
            "id": "c",
            "conversations": [{"from": "human", "value": "q" * 9}, {"from": "gpt", "value": "a" * 8}] * 2,
        },
        {"id": "d"},
    ]
    path = tmp_path / "ShareGPT_V3_unfiltered_cleaned_split.json"
    path.write_text(json.dumps(conversations))
    table = load_sharegpt_json(path, shuffle_seed=None, length_filter=False)
    assert table["num_prompt_tokens"].tolist() == [10, 3] and table["num_output_tokens"].tolist() == [101, 2]
    assert CHARS_PER_TOKEN == 4.0 and table["arrival_s"].isna().all()
    assert table.attrs["dropped_by"] == {"entries without two turns": 2}
    assert "estimated at 4 characters a token" in table.attrs["notes"][0]


def test_sharegpt_json_keeps_the_pairs_vllm_bench_serve_samples_in_its_shuffled_order(tmp_path):
    """vllm bench serve shuffles the conversations of two turns or more (random.seed(--seed); random.shuffle),
    then skips pairs whose prompt is under 4 or over 1024 tokens, completion under 4, or both over 2048."""
    prompt_and_answer = [  # tokens, at 4 characters a token
        (4, 4),  # kept: every bound met
        (3, 100),  # prompt too short
        (1024, 1024),  # kept: 2048 in all
        (1025, 4),  # prompt too long
        (100, 3),  # completion too short
        (1000, 1049),  # 2049 in all
        (50, 60),  # kept
    ]
    conversations = [
        {"id": str(i), "conversations": [{"from": "human", "value": "x" * 4 * p}, {"value": "y" * 4 * a}]}
        for i, (p, a) in enumerate(prompt_and_answer)
    ]
    conversations.insert(3, {"id": "one turn", "conversations": [{"value": "q" * 40}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    in_order = load_sharegpt_json(path, shuffle_seed=None)
    assert list(zip(in_order["num_prompt_tokens"], in_order["num_output_tokens"])) == [
        (4, 4),
        (1024, 1024),
        (50, 60),
    ]
    assert in_order.attrs["dropped_by"][SHAREGPT_LENGTHS] == 4
    assert in_order.attrs["dropped_by"]["entries without two turns"] == 1

    vllm_order = [c for c in conversations if len(c["conversations"]) >= 2]  # as vLLM does it, seed 0
    random.seed(0)
    random.shuffle(vllm_order)
    expected = [
        (len(c["conversations"][0]["value"]) // 4, len(c["conversations"][1]["value"]) // 4)
        for c in vllm_order
    ]
    expected = [pair for pair in expected if pair in {(4, 4), (1024, 1024), (50, 60)}]
    shuffled = load_sharegpt_json(path)
    assert list(zip(shuffled["num_prompt_tokens"], shuffled["num_output_tokens"])) == expected
    assert expected != [(4, 4), (1024, 1024), (50, 60)]  # the seed reorders these three
    other = load_sharegpt_json(path, shuffle_seed=1)
    assert sorted(zip(other["num_prompt_tokens"], other["num_output_tokens"])) == sorted(expected)
    every = load_sharegpt_json(path, shuffle_seed=None, length_filter=False)
    assert len(every) == len(prompt_and_answer) and SHAREGPT_LENGTHS not in every.attrs["dropped_by"]


def test_a_vllm_bench_result_is_a_length_table_in_sending_order(tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"num_prompts": 3, "input_lens": [300, 20, 4000], "output_lens": [7, 90, 1]}))
    table = load_vllm_bench(path)
    assert table["num_prompt_tokens"].tolist() == [300, 20, 4000] and table["num_output_tokens"].tolist() == [
        7,
        90,
        1,
    ]
    path.write_text(json.dumps({"num_prompts": 3}))  # saved without --save-detailed
    with pytest.raises(ValueError, match=r"result.json: no per-request input_lens .* --save-detailed"):
        load_vllm_bench(path)
    path.write_text("[" * 100_000)
    with pytest.raises(ValueError, match="result.json: not a vllm_bench JSON file"):
        load_vllm_bench(path)
    path.write_text(
        json.dumps({"input_lens": [300, 0, 20.5], "output_lens": [7, 9, 1]})
    )  # the second dropped
    with pytest.raises(ValueError, match=re.escape("input_lens must be whole token counts; data rows [3]")):
        load_vllm_bench(path)


def test_a_scenario_replays_a_vllm_bench_results_lengths_at_its_own_rate(tmp_path):
    from servesim.workloads.config import WorkloadConfig
    from servesim.workloads.generate import build_workload

    path = tmp_path / "result.json"
    path.write_text(json.dumps({"input_lens": [300, 20, 4000, 55], "output_lens": [7, 90, 1, 12]}))
    cfg = WorkloadConfig.model_validate(
        {
            "trace": {"format": "vllm_bench", "path": "result.json"},
            "arrivals": {"kind": "poisson", "rate_per_s": 2.0},
            "num_requests": 4,
        }
    )
    requests = build_workload(cfg, np.random.default_rng(0), tmp_path).requests
    assert [(r.num_prompt_tokens, r.num_output_tokens) for r in requests] == [
        (300, 7),
        (20, 90),
        (4000, 1),
        (55, 12),
    ]
    assert requests[0].arrival_s == 0 < requests[1].arrival_s
