"""The engines' documented command-line flags, as parsers: an emitted command must parse with them.

Written by hand from each project's documentation of its arguments, not from servesim's launch code:
- `vllm serve`: vLLM's engine arguments (docs.vllm.ai "Engine Arguments"; vllm/engine/arg_utils.py) and the
  OpenAI server's (--host, --port). Booleans take --X / --no-X.
- SGLang `python -m sglang.launch_server`: SGLang's server arguments (docs.sglang.ai "Server Arguments";
  python/sglang/srt/server_args.py).
- `trtllm-serve MODEL`: TensorRT-LLM's serve command (tensorrt_llm/commands/serve.py click options; docs
  "trtllm-serve"), and the LLM API fields its --extra_llm_api_options YAML may set (llmapi/llm_args.py:
  KvCacheConfig's enable_block_reuse, tokens_per_block, dtype; disable_overlap_scheduler; enable_attention_dp).
- Dynamo: `python -m dynamo.frontend` (--http-port, --router-mode round-robin|random|kv) and the workers
  `dynamo.vllm` / `dynamo.sglang`, which take their engine's flags plus --disaggregation-mode prefill|decode
  (ai-dynamo/dynamo examples/backends/*/deploy/disagg.yaml).
"""

from __future__ import annotations

import argparse
import json

VLLM_VALUED = {
    "--tensor-parallel-size": int,
    "--pipeline-parallel-size": int,
    "--data-parallel-size": int,
    "--max-num-seqs": int,
    "--max-num-batched-tokens": int,
    "--gpu-memory-utilization": float,
    "--max-model-len": int,
    "--block-size": int,
    "--long-prefill-token-threshold": int,
    "--kv-cache-dtype": ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"),
    "--quantization": str,
    "--scheduling-policy": ("fcfs", "priority"),
    "--speculative-config": json.loads,
    "--kv-transfer-config": json.loads,
    "--served-model-name": str,
    "--host": str,
    "--port": int,
}
VLLM_BOOLEANS = (
    "--enable-expert-parallel",
    "--enable-chunked-prefill",
    "--enable-prefix-caching",
    "--disable-hybrid-kv-cache-manager",
    "--async-scheduling",
)
SGLANG_VALUED = {
    "--model-path": str,
    "--tp-size": int,  # docs write --tp: argparse's prefix matching, which SGLang's parser keeps on
    "--pp-size": int,
    "--dp-size": int,  # and --dp
    "--ep-size": int,
    "--moe-a2a-backend": ("none", "deepep", "mooncake"),
    "--max-running-requests": int,
    "--chunked-prefill-size": int,
    "--mem-fraction-static": float,
    "--context-length": int,
    "--kv-cache-dtype": ("auto", "fp8_e5m2", "fp8_e4m3"),
    "--quantization": str,
    "--page-size": int,
    "--schedule-policy": ("lpm", "random", "fcfs", "dfs-weight"),
    "--swa-full-tokens-ratio": float,
    "--max-prefill-tokens": int,
    "--schedule-conservativeness": float,
    "--speculative-algorithm": ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
    "--speculative-draft-model-path": str,
    "--speculative-num-steps": int,
    "--speculative-eagle-topk": int,
    "--speculative-num-draft-tokens": int,
    "--disaggregation-mode": ("null", "prefill", "decode"),
    "--disaggregation-transfer-backend": ("mooncake", "nixl"),
    "--host": str,
    "--port": int,
}
SGLANG_SWITCHES = (
    "--enable-dp-attention",
    "--disable-radix-cache",
    "--disable-hybrid-swa-memory",
    "--enable-mixed-chunk",
    "--disable-overlap-schedule",
    "--enable-priority-scheduling",  # sglang server_args
    "--schedule-low-priority-values-first",
    "--disable-priority-preemption",
)


TRTLLM_VALUED = {
    "--backend": ("pytorch", "tensorrt", "_autodeploy"),
    "--tp_size": int,
    "--pp_size": int,
    "--ep_size": int,
    "--max_batch_size": int,
    "--max_num_tokens": int,
    "--max_seq_len": int,
    "--kv_cache_free_gpu_memory_fraction": float,
    "--extra_llm_api_options": str,
    "--host": str,
    "--port": int,
}
TRTLLM_SWITCHES = ("--enable_chunked_prefill", "--trust_remote_code")
TRTLLM_OPTIONS = {
    "kv_cache_config",
    "disable_overlap_scheduler",
    "enable_attention_dp",
    "batch_wait_timeout_iters",  # TorchLlmArgs (TensorRT-LLM 1.1)
    "batch_wait_max_tokens_ratio",
}
TRTLLM_KV_CACHE = {
    "enable_block_reuse": bool,
    "tokens_per_block": int,
    "dtype": ("auto", "fp8"),
    "free_gpu_memory_fraction": float,
}


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # raise instead of printing usage and exiting
        raise _Refused(message)


def _add(parser: argparse.ArgumentParser, flag: str, kind) -> None:
    if isinstance(kind, tuple):
        parser.add_argument(flag, choices=kind)
    else:
        parser.add_argument(flag, type=kind)


def vllm_parser(dynamo: bool = False) -> argparse.ArgumentParser:
    """`vllm serve MODEL [flags]` (or `dynamo.vllm --model MODEL [flags]`)."""
    parser = _Parser(prog="dynamo.vllm" if dynamo else "vllm serve", allow_abbrev=False)
    if dynamo:
        parser.add_argument("--model", required=True)
        parser.add_argument("--disaggregation-mode", choices=("prefill", "decode"))
    else:
        parser.add_argument("model")
    for flag, kind in VLLM_VALUED.items():
        _add(parser, flag, kind)
    for flag in VLLM_BOOLEANS:
        parser.add_argument(flag, action=argparse.BooleanOptionalAction)
    return parser


def sglang_parser() -> argparse.ArgumentParser:
    """`python -m sglang.launch_server [flags]` (and dynamo.sglang, which takes the same)."""
    parser = _Parser(prog="sglang.launch_server")  # prefixes allowed, as in SGLang
    for flag, kind in SGLANG_VALUED.items():
        _add(parser, flag, kind)
    for flag in SGLANG_SWITCHES:
        parser.add_argument(flag, action="store_true")
    return parser


def trtllm_parser() -> argparse.ArgumentParser:
    """`trtllm-serve MODEL [flags]` (click: no abbreviations)."""
    parser = _Parser(prog="trtllm-serve", allow_abbrev=False)
    parser.add_argument("model")
    for flag, kind in TRTLLM_VALUED.items():
        _add(parser, flag, kind)
    for flag in TRTLLM_SWITCHES:
        parser.add_argument(flag, action="store_true")
    return parser


def trtllm_inline_options(words: list[str]) -> tuple[list[str], dict | None]:
    """`words` with an inline `<(echo 'JSON')` options file replaced by one file name (options.yaml), and the JSON it holds
    (checked against the LLM API fields the options file may set), or None when there is none."""
    if "<(echo" not in words:
        return words, None
    at = words.index("<(echo")
    options = json.loads(words[at + 1].removesuffix(")"))
    unknown = set(options) - TRTLLM_OPTIONS | set(options.get("kv_cache_config", {})) - set(TRTLLM_KV_CACHE)
    if unknown:
        raise _Refused(f"unknown LLM API options {sorted(unknown)}")
    for key, value in options.get("kv_cache_config", {}).items():
        kind = TRTLLM_KV_CACHE[key]
        if (value not in kind) if isinstance(kind, tuple) else (type(value) is not kind):
            raise _Refused(f"kv_cache_config.{key}: {value!r}")
    return [*words[:at], "options.yaml", *words[at + 2 :]], options


def dynamo_frontend_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dynamo.frontend", allow_abbrev=False)
    parser.add_argument("--http-port", type=int)
    parser.add_argument("--router-mode", choices=("round-robin", "random", "kv"))
    return parser


def refusal(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """Why `parser` refuses `args`, or None when they parse."""
    try:
        parser.parse_args(args)
    except _Refused as err:
        return str(err)
    return None
