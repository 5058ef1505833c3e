"""Token counts of text with a model's own tokenizer (the `tokenizers` package reading its tokenizer.json), for
traces that hold text rather than counts: the ShareGPT conversations file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from servesim.hardware.errors import SpecError
from servesim.hardware.hf_models import cached_file, download_file, is_repo_id
from servesim.workloads.config import WorkloadConfig

TOKENIZER_FILE = "tokenizer.json"
INSTALL_HINT = 'pip install -e ".[hf]"'


def _tokenizers_installed() -> bool:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


def tokenizer_file(spec: str, fetch: bool = True) -> Path | None:
    """The tokenizer.json `spec` names: the file, a folder holding it, or a Hugging Face repo's (cached, else
    fetched; None where `fetch` is off and it is not cached)."""
    path = Path(spec)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if path.is_file():
        return path
    if not is_repo_id(spec):
        raise SpecError(
            f"trace.tokenizer {spec!r}: no such tokenizer.json, folder holding one, nor Hugging Face repo id"
        )
    return cached_file(spec, TOKENIZER_FILE) or (download_file(spec, TOKENIZER_FILE) if fetch else None)


def token_counter(spec: str) -> Callable[[list[str]], list[int]]:
    """Counts of each text's tokens under `spec`'s tokenizer, its special tokens (a BOS) included, as
    `vllm bench serve` counts a ShareGPT prompt and completion (the tokenizer's default call)."""
    if not _tokenizers_installed():
        raise SpecError(
            f"trace.tokenizer {spec!r}: counting tokens needs the tokenizers package: {INSTALL_HINT}"
        )
    from tokenizers import Tokenizer

    path = tokenizer_file(spec)
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 (its Rust core raises its own exception type)
        raise SpecError(
            f"trace.tokenizer {spec!r}: {path} is not a tokenizer.json ({str(err)[:80]})"
        ) from None
    return lambda texts: [len(e.ids) for e in tokenizer.encode_batch(texts)]


def with_model_tokenizer(cfg: WorkloadConfig, repo: str | None) -> WorkloadConfig:
    """`cfg` with a ShareGPT trace's unset tokenizer set to the model's (`repo`), when `tokenizers` is installed
    and the repo's tokenizer.json is in the Hugging Face cache; unchanged otherwise (the estimate then counts)."""
    trace = cfg.trace
    if trace is None or trace.format != "sharegpt_json" or trace.tokenizer is not None or repo is None:
        return cfg
    if not _tokenizers_installed() or cached_file(repo, TOKENIZER_FILE) is None:
        return cfg
    return cfg.model_copy(update={"trace": trace.model_copy(update={"tokenizer": repo})})


def counting_tokenizer(cfg: WorkloadConfig, repo: str | None) -> Path | None:
    """The tokenizer.json a run of `cfg` counts a ShareGPT trace's tokens with, where it is on disk (nothing is
    fetched): a saved result depends on it as on the trace."""
    trace = with_model_tokenizer(cfg, repo).trace
    if trace is None or trace.tokenizer is None:
        return None
    try:
        return tokenizer_file(trace.tokenizer, fetch=False)
    except SpecError:  # no such tokenizer: the run says so
        return None
