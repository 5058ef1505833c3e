"""Launch commands run what was simulated: prefix caching, expert parallel, DP attention, speculative decoding."""

from __future__ import annotations

import json
import shlex

from servesim.simulator.planning.launch import launch_notes, sglang_command, trtllm_command, vllm_command
from servesim.simulator.scenario import load_scenario
from tests.simulator.engine_flags import refusal, sglang_parser
from tests.simulator.study_helpers import SCENARIOS, chat

LEN = 16384


def commands(s) -> tuple[str, str]:
    return vllm_command(s, LEN), sglang_command(s, LEN)


def speculative(**spec) -> tuple[str, str, list[str]]:
    s = chat(engine={"speculative": {"acceptance": 0.7, **spec}})
    return *commands(s), launch_notes(s)


def test_prefix_caching_off_is_turned_off_and_the_engines_defaults_add_nothing():
    vllm, sglang = commands(chat(engine={"prefix_caching": "none"}))
    assert "--no-enable-prefix-caching" in vllm and "--disable-radix-cache" in sglang
    for caching in ("vllm", "radix"):  # each engine's own cache is on by default
        vllm, sglang = commands(chat(engine={"prefix_caching": caching}))
        assert "prefix-caching" not in vllm and "radix" not in sglang and "--page-size" not in sglang
    assert "--page-size 16" in commands(chat(engine={"prefix_caching": "radix", "radix_page_size": 16}))[1]


def test_expert_parallel_without_dp_attention_spreads_the_experts_over_the_tp_group():
    vllm, sglang = commands(chat(model="qwen3-30b-a3b", parallelism={"tp": 2, "ep": True}))
    assert "--tensor-parallel-size 2 --enable-expert-parallel" in vllm and "--data-parallel-size" not in vllm
    # all-reduce dispatch: SGLang's default backend
    assert "--tp 2 --ep-size 2 --max-running-requests" in sglang
    assert "--moe-a2a-backend" not in sglang and "--enable-dp-attention" not in sglang
    for s in (chat(model="qwen3-30b-a3b", parallelism={"tp": 2}), chat(parallelism={"tp": 2, "ep": True})):
        vllm, sglang = commands(s)  # no EP asked for, or a dense model it cannot change
        assert "expert-parallel" not in vllm and "--ep-size" not in sglang


def test_dp_attention_with_expert_parallel_runs_data_parallel_ranks_and_deepep():
    s, _ = load_scenario(SCENARIOS / "deepseek_v3_8xh200.yaml")
    vllm, sglang = commands(s)
    assert "--tensor-parallel-size 1 --data-parallel-size 8 --enable-expert-parallel" in vllm
    # vLLM's defaults, per rank as it runs them
    assert "--max-num-seqs 1024 --max-num-batched-tokens 8192" in vllm
    # the simulated group's: every rank's
    assert (
        s.with_engine_defaults().engine.max_num_seqs,
        s.with_engine_defaults().engine.max_num_batched_tokens,
    ) == (8 * 1024, 8 * 8192)
    assert "--tp 8 --enable-dp-attention --dp 8 --ep-size 8 --moe-a2a-backend deepep" in sglang
    # SGLang divides the totals itself
    assert "--max-running-requests 8192 --chunked-prefill-size 65536" in sglang
    notes = launch_notes(s)
    ranks = next(n for n in notes if n.startswith("vLLM runs DP attention as 8 data-parallel ranks"))
    assert (
        "SGLang slices the embeddings, LM head and dense MLP layers over the group (simulated whole" in ranks
    )
    assert any("--all2all-backend" in n for n in notes)
    sglang_run = s.model_copy(update={"engine": s.engine.model_copy(update={"scheduler": "sglang"})})
    ranks = next(n for n in launch_notes(sglang_run) if n.startswith("vLLM runs DP attention"))
    assert "its embeddings, LM head and dense MLP layers stay whole on every rank (simulated sliced" in ranks


def test_dp_attention_without_expert_parallel_slices_the_experts_and_a_dense_model_runs_whole_replicas():
    vllm, sglang = commands(chat(model="qwen3-30b-a3b", parallelism={"tp": 4, "dp_attention": True}))
    assert "--tensor-parallel-size 1 --data-parallel-size 4 --max-num-seqs" in vllm  # experts TP over DP x TP
    assert "--enable-dp-attention --dp 4 --max-running-requests" in sglang and "--ep-size" not in sglang
    dense = chat(parallelism={"tp": 4, "dp_attention": True})
    vllm, sglang = commands(dense)
    # as simulated: the whole model on each GPU
    assert "--tensor-parallel-size 1 --data-parallel-size 4" in vllm
    assert "--enable-dp-attention --dp 4" in sglang
    assert not any("independent engines" in n for n in launch_notes(dense))  # simulated as vLLM runs them
    assert not any("DP attention" in n for n in launch_notes(chat(parallelism={"tp": 4})))


def test_sglang_under_dp_attention_is_given_the_conservativeness_it_scales_back_to_the_simulated_one():
    def flags(conservativeness: float) -> str:
        return sglang_command(
            chat(
                model="qwen3-30b-a3b",
                parallelism={"tp": 4, "dp_attention": True},
                engine={"scheduler": "sglang", "schedule_conservativeness": conservativeness},
            ),
            LEN,
        )

    assert "--schedule-conservativeness 3.333" in flags(1.0)  # SGLang runs 0.3 x the flag under DP attention
    assert "--schedule-conservativeness" not in flags(0.3)
    unset = chat(
        model="qwen3-30b-a3b", parallelism={"tp": 4, "dp_attention": True}, engine={"scheduler": "sglang"}
    )
    assert unset.with_engine_defaults().engine.schedule_conservativeness == 0.3  # simulated as SGLang runs it
    assert "--schedule-conservativeness" not in sglang_command(unset, LEN)
    assert chat(engine={"scheduler": "sglang"}).with_engine_defaults().engine.schedule_conservativeness == 1.0


def test_sglang_is_told_the_recv_interval_simulated():
    every_step = sglang_command(chat(engine={"scheduler": "sglang"}), LEN)
    tenth = sglang_command(chat(engine={"scheduler": "sglang", "scheduler_recv_interval": 10}), LEN)
    assert "--scheduler-recv-interval" not in every_step and "--scheduler-recv-interval 10" in tenth


def test_a_draft_model_runs_as_the_speculative_config_and_sglang_standalone():
    s, _ = load_scenario(SCENARIOS / "speculative_70b.yaml")
    vllm, sglang = commands(s)
    assert vllm.endswith(
        ' --speculative-config \'{"method": "draft_model", "num_speculative_tokens": 4, '
        '"model": "meta-llama/Llama-3.2-1B"}\''
    )
    config = json.loads(shlex.split(vllm)[-1])  # one shell word of valid JSON
    assert config == {
        "method": "draft_model",
        "num_speculative_tokens": 4,
        "model": "meta-llama/Llama-3.2-1B",
    }
    assert sglang.endswith(
        " --speculative-algorithm STANDALONE --speculative-draft-model-path meta-llama/Llama-3.2-1B "
        "--speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5"
    )
    assert any(n.startswith("speculation simulated off under load") for n in launch_notes(s))


def test_heads_and_ngram_map_where_the_engines_have_the_method():
    vllm, sglang, notes = speculative(method="eagle", k=3)
    assert '--speculative-config \'{"method": "eagle", "num_speculative_tokens": 3}\'' in vllm
    assert (
        "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 4" in sglang
    )
    assert any(n.startswith("speculative method eagle: add the EAGLE head's repo") for n in notes)
    vllm, sglang, notes = speculative(method="mtp", k=1)
    assert '\'{"method": "mtp", "num_speculative_tokens": 1}\'' in vllm
    assert "--speculative-algorithm EAGLE --speculative-num-steps 1" in sglang  # SGLang's MTP runs as EAGLE
    vllm, sglang, notes = speculative(method="ngram", k=5)
    assert '\'{"method": "ngram", "num_speculative_tokens": 5}\'' in vllm and "speculative" not in sglang
    assert any(n.startswith("speculative method ngram") for n in notes)
    vllm, sglang = commands(chat())
    assert "speculative" not in vllm and "speculative" not in sglang
    assert not any("specul" in n for n in launch_notes(chat()))


def test_sglang_keeps_its_own_slot_cap_and_vllm_its_own_defaults_for_an_sglang_scenario():
    """Unset, SGLang's max_running_requests is what SGLang derives (capped by the pool; an explicit 4096 would
    skip that cap); vLLM's command for the same scenario takes vLLM's max_num_seqs and memory share, not
    SGLang's 4096 slots and mem_fraction_static, and a set slot count no larger than a step's tokens."""
    s = chat(engine={"scheduler": "sglang", "prefix_caching": "radix"})
    vllm, sglang = commands(s)
    assert "--max-running-requests" not in sglang and "--mem-fraction-static 0.8" in sglang
    assert "--max-num-seqs 1024 " in vllm and "--gpu-memory-utilization 0.9 " in vllm
    vllm, sglang = commands(
        chat(engine={"scheduler": "sglang", "prefix_caching": "radix", "max_num_seqs": 256})
    )
    assert "--max-running-requests 256" in sglang and "--max-num-seqs 256 " in vllm
    vllm, sglang = commands(
        chat(engine={"scheduler": "sglang", "max_num_seqs": 4096, "max_num_batched_tokens": 2048})
    )
    assert "--max-running-requests 4096" in sglang and "--max-num-seqs 2048 " in vllm  # vLLM: slots <= tokens
    assert "--max-running-requests 1024" in commands(chat())[1]  # vLLM's simulated slots, spelled for SGLang


def test_a_context_past_the_models_own_carries_the_engines_environment_variables():
    s = chat(engine={"max_model_len": 200000, "allow_long_max_model_len": True})
    vllm, sglang = vllm_command(s, 200000), sglang_command(s, 200000)
    assert vllm.startswith("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 vllm serve ")
    assert sglang.startswith("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python -m sglang.launch_server ")
    assert not any("ALLOW" in command for command in commands(chat()))


def test_a_block_size_vllm_refuses_is_noted():
    assert any(
        "block_size 48: vLLM accepts 1, 8, 16" in note
        for note in launch_notes(chat(engine={"block_size": 48}))
    )
    assert not any("block_size" in note for note in launch_notes(chat(engine={"block_size": 32})))


def test_sglang_is_told_the_sliding_window_pool_it_was_simulated_with():
    """gpt-oss mixes sliding and full layers: SGLang's two pools are its default (no flag), a changed ratio is
    passed, and one pool of every layer is its --disable-hybrid-swa-memory; Gemma, which SGLang runs whole anyway,
    and a model without sliding layers get neither flag."""

    def sglang(model, **engine):
        return commands(
            chat(model=model, engine={"scheduler": "sglang", "prefix_caching": "radix", **engine})
        )[1]

    assert "swa" not in sglang("gpt-oss-20b")
    assert "--swa-full-tokens-ratio 0.5" in sglang("gpt-oss-20b", swa_full_tokens_ratio=0.5)
    assert "--disable-hybrid-swa-memory" in sglang("gpt-oss-20b", disable_hybrid_kv_cache_manager=True)
    assert "swa" not in sglang("gemma-3-12b") and "swa" not in sglang(
        "llama-3.1-8b", swa_full_tokens_ratio=0.5
    )


def test_a_dense_models_dp_ranks_are_noted_only_where_they_still_step_together():
    dense_dp = {"parallelism": {"tp": 2, "dp_attention": True}}
    pd = chat(
        **dense_dp,
        disaggregation={
            "prefill": {"replicas": 1, "tp": 2},
            "decode": {"replicas": 1, "tp": 2},
            "transfer": {"link": "ib-ndr-400"},
        },
    )
    assert any("independent engines" in note for note in launch_notes(pd))


def test_the_cuda_graphs_simulated_are_the_ones_launched():
    vllm = vllm_command(
        chat(engine={"cuda_graph_sizes": [16, 1, 8], "cuda_graph_mode": "full_decode_only"}), LEN
    )
    config = json.loads(shlex.split(vllm.split("--compilation-config ")[1])[0])
    assert config == {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 8, 16]}
    assert "--enforce-eager" in vllm_command(chat(engine={"cuda_graph_max_size": 0}), LEN)
    assert "compilation-config" not in vllm_command(chat(), LEN)
    sglang = chat(engine={"scheduler": "sglang", "prefix_caching": "radix", "cuda_graph_max_size": 64})
    assert "--cuda-graph-max-bs 64" in sglang_command(sglang, LEN)
    # sizes in an engine's own units go to that engine only: vLLM's tokens are not SGLang's requests
    assert "cuda-graph" not in sglang_command(chat(engine={"cuda_graph_max_size": 64}), LEN)
    trtllm = trtllm_command(chat(engine={"scheduler": "trtllm", "cuda_graph_max_size": 256}), LEN)
    options = json.loads(shlex.split(trtllm.split("--extra_llm_api_options <(echo ")[1].removesuffix(")"))[0])
    assert options["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": 256}
    assert "cuda_graph_config" not in trtllm_command(chat(engine={"scheduler": "trtllm"}), LEN)


def test_priority_order_is_sglangs_priority_scheduling_in_vllms_sense():
    """The simulated order is vLLM's: lower values first, a waiting request never preempting a running one.
    SGLang's priority scheduling schedules higher values first and preempts unless told otherwise."""
    vllm, sglang = commands(chat(engine={"queue_order": "priority"}))
    assert "--scheduling-policy priority" in vllm
    flags = (
        "--enable-priority-scheduling",
        "--schedule-low-priority-values-first",
        "--disable-priority-preemption",
    )
    assert all(flag in shlex.split(sglang) for flag in flags)
    assert refusal(sglang_parser(), shlex.split(sglang)[3:]) is None
