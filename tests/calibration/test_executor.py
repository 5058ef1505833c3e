"""The paged executor gives the same logits as a plain full-attention forward of the same weights.

Block size 4 and sliding windows of 8 tokens, so prompts of 20-30 tokens cross many block and window
boundaries; blocks are handed out shuffled, so a wrong block table or slot mapping shows at once.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from servesim.calibration import attention
from servesim.calibration.attn_metadata import AttnMetadata, make_kv_sharing_fast_prefill_metadata
from servesim.calibration.reference import reference_logits
from tests.calibration.conftest import Blocks, Seq, step, tiny_executor

CASES = [("llama", False), ("gemma2", False), ("gemma3n", False), ("gemma3n", True), ("mixtral", False)]
IDS = ["llama", "gemma2-sliding", "gemma3n-shared", "gemma3n-fast-prefill", "mixtral-moe"]
ATOL = 1e-4


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=ATOL, rtol=0), f"max abs diff {(got - want).abs().max():.2e}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("name,fast", CASES, ids=IDS)
def test_prefill_then_greedy_decode_matches_reference(name, fast):
    ex, blocks = tiny_executor(name, fast), Blocks()
    seq = Seq(prompt(21, 0), blocks)
    logits = [step(ex, seq.part(21, True))[0]]
    for _ in range(6):  # greedy decode: feed back the argmax, one token per step
        seq.tokens.append(int(logits[-1].argmax()))
        logits.append(step(ex, seq.part(1, True))[0])
    ref = reference_logits(ex, seq.tokens)
    assert_close(torch.stack(logits), ref[20:27])


@pytest.mark.parametrize("name,fast", CASES, ids=IDS)
def test_chunked_prefill_matches_reference(name, fast):
    ex, seq = tiny_executor(name, fast), Seq(prompt(25, 1), Blocks())
    assert step(ex, seq.part(5, False)).shape[0] == 0  # a non-final chunk asks for no logits
    step(ex, seq.part(9, False))
    last = step(ex, seq.part(11, True))
    assert_close(last, reference_logits(ex, seq.tokens)[-1:])


@pytest.mark.parametrize("name,fast", CASES, ids=IDS)
def test_mixed_prefill_and_decode_batch_matches_reference(name, fast):
    ex, blocks = tiny_executor(name, fast), Blocks()
    a, b, c = Seq(prompt(13, 2), blocks), Seq(prompt(22, 3), blocks), Seq(prompt(10, 4), blocks)
    a.tokens.append(int(step(ex, a.part(13, True))[0].argmax()))
    step(ex, b.part(7, False))
    # one forward: a decodes, b runs its last chunk over 7 cached tokens, c prefills whole
    logits = step(ex, a.part(1, True), b.part(15, True), c.part(10, True))
    want = torch.stack([reference_logits(ex, s.tokens)[-1] for s in (a, b, c)])
    assert_close(logits, want)


@pytest.mark.parametrize("name,fast", CASES, ids=IDS)
def test_prefix_reuse_prefills_only_the_tail(name, fast):
    ex, blocks = tiny_executor(name, fast), Blocks()
    a = Seq(prompt(18, 5), blocks)
    step(ex, a.part(18, True))
    shared = 16  # four full blocks of A hold the prefix's KV
    b = Seq(a.tokens[:shared] + prompt(9, 6), blocks, table=a.table[: shared // 4], computed=shared)
    got = [step(ex, b.part(9, True))[0]]
    b.tokens.append(int(got[0].argmax()))
    got.append(step(ex, b.part(1, True))[0])
    assert_close(torch.stack(got), reference_logits(ex, b.tokens)[-2:])
    a.tokens.append(7)  # A's own blocks were not overwritten by B
    assert_close(step(ex, a.part(1, True)), reference_logits(ex, a.tokens)[-1:])


def test_kv_sharing_layers_own_no_pool_and_read_their_source():
    ex = tiny_executor("gemma3n")
    sources = [layer.kv_source for layer in ex.spec.layers]
    assert sources == [0, 1, 2, 3, 2, 3]  # last 2 layers reuse the last sliding (2) and full (3) layer
    assert sorted(ex.kv) == [0, 1, 2, 3]
    assert ex.num_self_layers == 4


def test_fast_prefill_runs_cross_layers_on_one_token_per_request(monkeypatch):
    ex, blocks = tiny_executor("gemma3n", fast_prefill=True), Blocks()
    seen = []
    original = attention.paged_attention

    def spy(q, *args):
        seen.append(q.shape[0])
        return original(q, *args)

    monkeypatch.setattr("servesim.calibration.executor.paged_attention", spy)
    a, b = Seq(prompt(12, 7), blocks), Seq(prompt(9, 8), blocks)
    step(ex, a.part(12, True), b.part(5, False))
    # 4 KV-owning layers on all tokens, 2 shared layers on 1 per request
    assert seen == [
        17,
        17,
        17,
        17,
        2,
        2,
    ]


def test_fast_prefill_metadata_reproduces_the_seed_example():
    meta = AttnMetadata(
        torch.tensor([0, 15, 20, 28]),
        torch.tensor([41, 31, 40]),
        np.zeros((3, 1), np.int64),
        16,
        torch.device("cpu"),
    )
    reduced = make_kv_sharing_fast_prefill_metadata(meta, torch.tensor([14, 18, 19, 27]))
    assert reduced.query_start_loc.tolist() == [0, 1, 3, 4]
    assert reduced.seq_lens.tolist() == [41, 31, 40] and reduced.max_query_len == 2


def test_all_decode_batch_keeps_its_metadata():
    meta = AttnMetadata(
        torch.tensor([0, 1, 2]), torch.tensor([5, 9]), np.zeros((2, 3), np.int64), 4, torch.device("cpu")
    )
    assert make_kv_sharing_fast_prefill_metadata(meta, torch.tensor([0, 1])) is meta


def test_decodes_gather_exactly_their_visible_blocks_in_chunks():
    table = np.arange(40).reshape(5, 8)
    meta = AttnMetadata(
        torch.arange(6), torch.tensor([3, 5, 8, 9, 30]), table, 4, torch.device("cpu"), max_gather_tokens=16
    )
    # blocks held: 1, 2, 2, 3, 8; at most 16 keys = 4 blocks per chunk, a request is never split
    chunks = meta.plan(None).decode
    assert [c.q_index.tolist() for c in chunks] == [[0, 1], [2], [3], [4]]
    assert chunks[0].block_ids.tolist() == [0, 8, 9] and chunks[0].block_req.tolist() == [0, 1, 1]
    assert chunks[0].mask[:, 0].sum(-1).tolist() == [3, 4, 1]  # 3 keys, then 4 + 1 of 5
    # a window of 6 keys: request 4 (30 tokens) sees keys 24..29, i.e. blocks 6 and 7 of its table
    last = meta.plan(6).decode[-1]
    assert last.block_ids.tolist() == [38, 39] and last.mask[:, 0].sum().item() == 6
