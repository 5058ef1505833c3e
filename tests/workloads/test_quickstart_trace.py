"""The trace slice bundled for the quickstart: always present, never skipped."""

import pytest

from tests.workloads.paths import QUICKSTART_TRACE, SHARED_TRACES_DIR
from servesim.workloads.traces import load_azure


def test_bundled_slice_loads():
    lines = QUICKSTART_TRACE.read_bytes().splitlines(keepends=True)
    # CRLF line endings, as in the public file (the slice is byte-exact)
    assert lines[0] == b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n" and len(lines) == 2001
    df = load_azure(QUICKSTART_TRACE)
    assert len(df) == 2000 and df.attrs["dropped"] == 0
    assert df["arrival_s"].iloc[-1] == pytest.approx(424.259457, abs=1e-6)
    assert df["num_prompt_tokens"].sum() == 2_209_565 and df["num_output_tokens"].sum() == 529_807
    assert (QUICKSTART_TRACE.parent / "README.md").read_text().count("CC-BY 4.0") >= 1


def test_bundled_slice_is_a_byte_exact_prefix_of_the_public_file():
    source = SHARED_TRACES_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    if not source.is_file():
        pytest.skip(
            f"public trace not found at {source}; the slice itself is checked in test_bundled_slice_loads"
        )
    sliced = QUICKSTART_TRACE.read_bytes()
    assert source.read_bytes()[: len(sliced)] == sliced
    assert source.read_bytes()[len(sliced) - 1 : len(sliced)] == b"\n"
