"""The input fuzzer in the suite: a small fixed-seed campaign over the bundled scenarios (the full one is
`python -m tests.fuzz.campaign`), and every case a campaign found kept as a regression test."""

import json
import shutil
from pathlib import Path

import pytest

from tests.fuzz.bases import bundled_bases
from tests.fuzz.campaign import case_for, run_campaign
from tests.fuzz.verdict import OK_VERDICTS, judge, start, wait

FOUND = Path(__file__).parent / "found"
SUITE_CASES = 80


def test_a_fixed_seed_campaign_finds_nothing(tmp_path):
    """Each case is refused with one line and no output folder, or runs with sound outputs (every request
    finished, rejected with a reason or unfinished; TTFT <= E2E; no more tokens than asked; KV usage in [0, 1];
    no NaN in summary.json); never a traceback, a hang or a non-finite number accepted."""
    counts, findings = run_campaign(SUITE_CASES, seed=2026, workers=2, timeout_s=60, folder=tmp_path)
    assert not findings, "\n".join(
        f"case {i} ({c.base}; {'; '.join(c.changes)}): {v.kind}: {v.detail}" for i, c, v in findings
    )
    assert counts["refused"] > 0 and counts["ran"] > 0  # the mutations reach both outcomes


def test_cases_are_the_same_on_every_run():
    bases = bundled_bases()
    first, again = case_for(7, 3, bases), case_for(7, 3, bases)
    assert (first.text, first.files, first.changes) == (again.text, again.files, again.changes)


@pytest.mark.parametrize(
    "case", sorted(p.name for p in FOUND.iterdir() if p.is_dir()) if FOUND.exists() else []
)
def test_a_case_a_campaign_found_stays_fixed(tmp_path, case):
    """Found cases, kept as their folders: `case.json` says what was mutated and what servesim did then."""
    folder = tmp_path / case
    shutil.copytree(FOUND / case, folder)
    meta = json.loads((folder / "case.json").read_text())
    code, seconds = wait(start(folder, meta.get("argv")), timeout_s=60)
    verdict = judge(folder, code, seconds, meta["non_finite"], meta["trace_non_finite"], not meta.get("argv"))
    assert verdict.kind in OK_VERDICTS, (
        f"{case} ({'; '.join(meta['changes'])}): {verdict.kind}: {verdict.detail}"
    )
    if "expect" in meta:
        assert verdict.kind == meta["expect"], verdict.detail


def test_a_non_finite_number_counts_only_where_servesim_reads_it():
    """A trace cell made non-finite must be refused or its row dropped only where a loader reads that column: the
    arXiv table's pd_ratio (column 3) is read by nobody, its Azure trace's token counts are."""
    bases = bundled_bases()
    unread, read = case_for(3487, 7777, bases), case_for(41, 7777, bases)
    assert unread.changes == ["trace_arxiv_summarization_lengths.csv: row 37 column 3 = '-inf'"]
    assert read.changes == ["trace_AzureLLMInferenceTrace_conv.csv: row 32 column 2 = 'inf'"]
    assert not unread.trace_non_finite and read.trace_non_finite
    # nor in a file the scenario no longer reads: its workload taken from a base that uses no trace
    dropped = case_for(4140, 424242, bases)
    assert dropped.changes[-1] == "workload from pd_disaggregated_70b" and not dropped.trace_non_finite
