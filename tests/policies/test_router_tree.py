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


class View:
    """A replica as the router sees it, its load set by the test."""

    def __init__(self):
        self.num_outstanding, self.kv_usage = 0, 0.0


def test_the_router_evicts_at_its_interval_so_a_stale_prefix_stops_attracting_requests(monkeypatch):
    monkeypatch.setattr(PrefixAffinityRouter, "max_tree_tokens", 150)
    replicas = [View(), View()]
    router = PrefixAffinityRouter(replicas, np.random.default_rng(0))
    prompt = ((7, 120),)  # one 120-token document
    assert router.route(Request(0, 0.0, 120, 10, prompt_segments=prompt)) is replicas[0]
    replicas[0].num_outstanding = 1
    # an unrelated prompt matches nothing: it goes to the least loaded replica, 1
    assert router.route(Request(1, 1.0, 90, 10, prompt_segments=((8, 90),))) is replicas[1]
    # a hit goes to its tree's replica, though it is the busier
    assert router.route(Request(2, 2.0, 120, 10, prompt_segments=prompt)) is replicas[0]
    # newer unrelated prompts alternate between the replicas: both trees pass 150 tokens
    for i in range(3, 6):
        replicas[i % 2].num_outstanding, replicas[1 - i % 2].num_outstanding = 1, 0
        router.route(Request(i, 3.0 + i, 100, 10, prompt_segments=((20 + i, 100),)))
    assert min(tree.num_tokens for tree in router.trees) > 150
    assert router.trees[0].match(key((7, 120))) == 120  # nothing evicted before the 120 s tick
    router.route(Request(9, 121.0, 10, 10, prompt_segments=((99, 10),)))
    assert all(tree.num_tokens <= 150 + 10 for tree in router.trees)
    assert router.trees[0].match(key((7, 120))) == 0  # the least recently used document is gone


def test_a_prompt_no_tree_shares_goes_to_the_least_loaded_replica_whatever_the_trees_hold():
    """The gateway's cache miss takes the least loaded worker (sgl-project/sglang#14650), not the smallest tree:
    an idle replica with a large tree beats a busy one with a small tree; ties go to the lowest index."""
    replicas = [View(), View()]
    router = PrefixAffinityRouter(replicas, np.random.default_rng(0))
    router.route(Request(0, 0.0, 3000, 10, prompt_segments=((1, 3000),)))
    assert router.trees[0].num_tokens == 3000 and router.trees[1].num_tokens == 0
    replicas[1].num_outstanding = 50  # 50 apart: under the imbalance check's 64
    assert router.route(Request(1, 1.0, 200, 10, prompt_segments=((2, 200),))) is replicas[0]
    replicas[0].num_outstanding = 50
    assert router.route(Request(2, 2.0, 200, 10, prompt_segments=((3, 200),))) is replicas[0]
