"""ShareGPT text counted with a tokenizer: given, or the model's own from the Hugging Face cache; else estimated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")  # the [hf] extra; README's test command installs it
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers  # noqa: E402

from servesim.hardware.errors import SpecError  # noqa: E402
from servesim.simulator.scenario import load_scenario  # noqa: E402
from servesim.simulator.world.run import workload_of  # noqa: E402
from servesim.workloads.config import TraceSource  # noqa: E402
from servesim.workloads.traces import load_sharegpt_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONVERSATIONS = [
    {
        "id": "a",
        "conversations": [{"from": "human", "value": "how are you"}, {"from": "gpt", "value": "fine"}],
    },
    {
        "id": "b",
        "conversations": [
            {"from": "human", "value": "hello world hello world"},
            {"from": "gpt", "value": "hi there"},
        ],
    },
    {"id": "c", "conversations": [{"from": "human", "value": "alone"}]},
]


def tokenizer_json(path: Path) -> Path:
    """A word-level tokenizer that prefixes a BOS, as Llama's does: a text of n words is n + 1 tokens."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    words = " ".join(turn["value"] for c in CONVERSATIONS for turn in c["conversations"])
    tokenizer.train_from_iterator([words], trainers.WordLevelTrainer(special_tokens=["[UNK]", "<s>"]))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


@pytest.fixture
def sharegpt(tmp_path) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(CONVERSATIONS))
    return path


def test_a_tokenizer_file_or_its_folder_counts_each_turn_with_its_bos(tmp_path, sharegpt):
    path = tokenizer_json(tmp_path / "tok" / "tokenizer.json")
    for spec in (str(path), str(path.parent)):
        table = load_sharegpt_json(sharegpt, spec, shuffle_seed=None, length_filter=False)
        assert table["num_prompt_tokens"].tolist() == [4, 5] and table["num_output_tokens"].tolist() == [2, 3]
        assert table.attrs["notes"] == (f"{sharegpt}: tokens counted with {spec}'s tokenizer",)
    estimated = load_sharegpt_json(sharegpt, shuffle_seed=None, length_filter=False)  # 11 and 23 characters
    assert estimated["num_prompt_tokens"].tolist() == [3, 6] and "estimated" in estimated.attrs["notes"][0]


def test_the_models_cached_tokenizer_counts_a_scenarios_sharegpt_trace(tmp_path, sharegpt, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    s, base = load_scenario(
        ROOT / "scenarios" / "quickstart.yaml",
        [
            # the counts, not vllm bench serve's sampling: the file's order, every pair
            f"workload.trace={{format: sharegpt_json, path: {sharegpt}, shuffle_seed: null, length_filter: false}}",
            "workload.arrivals={kind: poisson, rate_per_s: 1}",
            "workload.num_requests=2",
        ],
    )
    estimated = workload_of(s, base)
    assert [r.num_prompt_tokens for r in estimated.requests] == [3, 6]  # nothing cached: the estimate
    snapshot = hub / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "abc"
    tokenizer_json(snapshot / "tokenizer.json")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc")
    counted = workload_of(s, base)
    assert [r.num_prompt_tokens for r in counted.requests] == [4, 5]
    assert any("counted with meta-llama/Llama-3.1-8B's tokenizer" in note for note in counted.notes)


def test_a_tokenizer_that_is_not_one_says_so(tmp_path, sharegpt, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(SpecError, match="trace.tokenizer 'nowhere.json': no such tokenizer.json"):
        load_sharegpt_json(sharegpt, "nowhere.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SpecError, match="bad.json is not a tokenizer.json"):
        load_sharegpt_json(sharegpt, str(tmp_path / "bad.json"))
    with pytest.raises(SpecError, match="'org/model': not in the Hugging Face cache"):
        load_sharegpt_json(sharegpt, "org/model")
    with pytest.raises(ValueError, match="trace.tokenizer is a sharegpt_json option, but format is 'azure'"):
        TraceSource(format="azure", path="t.csv", tokenizer="org/model")
    for option in ({"shuffle_seed": None}, {"length_filter": False}):
        with pytest.raises(ValueError, match=f"trace.{next(iter(option))} is a sharegpt_json option"):
            TraceSource(format="mooncake", path="t.jsonl", **option)
