"""The cache-aware router's approximate trees forget what was least recently sent, as SGLang's router does."""

import numpy as np

from servesim.policies.radix import TokenTrie
from servesim.policies.routing import PrefixAffinityRouter
from servesim.workloads.request import Request


def key(*runs):
    """(segment, offset, length) pieces of a prompt made of whole segments."""
    return tuple((segment, 0, length) for segment, length in runs)


def test_eviction_drops_least_recently_inserted_leaves_and_keeps_shared_prefixes():
    tree = TokenTrie()
    tree.insert(key((1, 100), (2, 50)))  # system prompt 1 + question A
    tree.insert(key((1, 100), (3, 50)))  # system prompt 1 + question B
    tree.insert(key((4, 80)))
    tree.insert(key((1, 100), (2, 50)))  # A again: now B is the least recent
    assert tree.num_tokens == 280
    tree.evict_to(230)
    assert tree.num_tokens == 230
    assert tree.match(key((1, 100), (3, 50))) == 100 and tree.match(key((1, 100), (2, 50))) == 150
    tree.evict_to(150)  # the 80-token prompt goes next, then A's leaf would
    assert tree.match(key((4, 80))) == 0 and tree.match(key((1, 100), (2, 50))) == 150
    tree.evict_to(60)  # A's leaf, then the shared prefix once it has no children left
    assert tree.num_tokens == 0 and tree.match(key((1, 100))) == 0


class Idle:
    num_outstanding, kv_usage = 0, 0.0


def test_the_router_evicts_at_its_interval_so_a_stale_prefix_stops_attracting_requests(monkeypatch):
    monkeypatch.setattr(PrefixAffinityRouter, "max_tree_tokens", 150)
    replicas = [Idle(), Idle()]
    router = PrefixAffinityRouter(replicas, np.random.default_rng(0))
    prompt = ((7, 120),)  # one 120-token document
    assert router.route(Request(0, 0.0, 120, 10, prompt_segments=prompt)) is replicas[0]
    # an unrelated prompt matches nothing: it goes to the smaller tree, replica 1's
    assert router.route(Request(1, 1.0, 90, 10, prompt_segments=((8, 90),))) is replicas[1]
    assert router.route(Request(2, 2.0, 120, 10, prompt_segments=prompt)) is replicas[0]  # a hit
    for i in range(3, 6):  # newer unrelated prompts alternate between the smaller trees: both pass 150 tokens
        router.route(Request(i, 3.0 + i, 100, 10, prompt_segments=((20 + i, 100),)))
    assert router.trees[0].match(key((7, 120))) == 120  # nothing evicted before the 120 s tick
    router.route(Request(9, 121.0, 10, 10, prompt_segments=((99, 10),)))
    assert all(tree.num_tokens <= 150 + 10 for tree in router.trees)
    assert router.trees[0].match(key((7, 120))) == 0  # the least recently used document is gone
