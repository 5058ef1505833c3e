"""Models named as Hugging Face names them: a repo id, a downloaded snapshot folder, or a file in the local cache.

A repo id whose architecture a bundled preset holds resolves to that preset; any other is read from the local
Hugging Face cache (huggingface_hub's layout, under HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub), and
fetched with huggingface_hub when it is installed and the machine is online (cached afterwards).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from urllib.parse import urlparse
from pathlib import Path

from servesim.hardware.errors import SpecError

#: Preset -> the Hugging Face repo whose config.json it is (hardware/model_configs/SOURCES.md).
HF_REPO_IDS = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
    "gemma-2-9b": "google/gemma-2-9b",
    "gemma-3n-e2b": "google/gemma-3n-E2B-it",
    "gemma-3n-e4b": "google/gemma-3n-E4B-it",
    "deepseek-v2": "deepseek-ai/DeepSeek-V2",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "gemma-3-4b": "google/gemma-3-4b-it",
    "gemma-3-12b": "google/gemma-3-12b-it",
    "gemma-3-27b": "google/gemma-3-27b-it",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",
    "minimax-m2.5": "MiniMaxAI/MiniMax-M2.5",
    "qwen3-coder-480b-a35b": "Qwen/Qwen3-Coder-480B-A35B-Instruct",
    "glm-4.7": "zai-org/GLM-4.7",
    "glm-4.5-air": "zai-org/GLM-4.5-Air",
}
#: Other repos whose config.json differs from a preset's only in bookkeeping (chat tuning, ids, dtype): the same
#: architecture, sizes and quantization.
HF_ALIASES = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.1-405B-Instruct": "llama-3.1-405b",
    "meta-llama/Llama-3.2-1B-Instruct": "llama-3.2-1b",
    "meta-llama/Llama-2-7b-chat-hf": "llama-2-7b",
    "mistralai/Mistral-7B-Instruct-v0.1": "mistral-7b",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
    "google/gemma-2-9b-it": "gemma-2-9b",
    "deepseek-ai/DeepSeek-R1": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-v3",
}
_BY_REPO = {repo.lower(): preset for preset, repo in HF_REPO_IDS.items()} | {
    repo.lower(): preset for repo, preset in HF_ALIASES.items()
}
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", re.ASCII)
MAX_REPO_ID = 96 + 1 + 96  # the Hub's longest namespace and name
INSTALL_HINT = 'pip install -e ".[hf]"'


def preset_for_repo(repo: str) -> str | None:
    """The preset holding `repo`'s architecture (any letter case), or None."""
    return _BY_REPO.get(repo.lower())


def _on_disk(path: Path, kind: str = "any") -> bool:
    """Whether `path` exists (as a file, for `kind` "file"); a name the system refuses (too long) does not."""
    try:
        return path.is_file() if kind == "file" else path.exists()
    except OSError:
        return False


def is_repo_id(value: str) -> bool:
    """Whether `value` has a Hugging Face repo id's shape (`org/name`) and names no local file or folder."""
    return len(value) <= MAX_REPO_ID and bool(_REPO_ID.fullmatch(value)) and not _on_disk(Path(value))


def snapshot_config(folder: Path) -> Path | None:
    """A downloaded model folder's config.json, if it holds one."""
    path = Path(folder) / "config.json"
    return path if _on_disk(path, "file") else None


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def cached_file(repo: str, filename: str = "config.json", cache: Path | None = None) -> Path | None:
    """`repo`'s `filename` in the cache: the snapshot `refs/main` names, else the newest snapshot holding one."""
    cache = cache or hub_cache()
    folder = cache / f"models--{repo.replace('/', '--')}"
    if not folder.is_dir():  # repo ids are matched without regard to case, as the Hub does
        wanted = folder.name.lower()
        folder = next((f for f in cache.glob("models--*") if f.name.lower() == wanted), folder)
    main = folder / "refs" / "main"
    if main.is_file():
        path = folder / "snapshots" / main.read_text().strip() / filename
        if path.is_file():
            return path
    found = sorted(folder.glob(f"snapshots/*/{filename}"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _hub_reachable() -> bool:
    """Whether the Hub's host name resolves: one lookup, no retries (HF_HUB_OFFLINE: huggingface_hub itself
    refuses at once, and says so)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    from huggingface_hub.constants import ENDPOINT

    try:
        socket.getaddrinfo(urlparse(ENDPOINT).hostname or "", 443)
    except OSError:
        return False
    return True


def download_file(repo: str, filename: str = "config.json") -> Path:
    """Fetch `repo`'s `filename` into the cache with huggingface_hub; SpecError (one line) when it cannot."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise SpecError(
            f"model {repo!r}: no preset holds it and it is not in the Hugging Face cache ({hub_cache()}); "
            f"{INSTALL_HINT} to fetch it, or give its config.json"
        ) from None
    if not _hub_reachable():  # its client retries a dead connection for ~25 s before it gives up
        raise SpecError(
            f"model {repo!r}: not in the Hugging Face cache ({hub_cache()}), and the Hub is not reachable "
            f"(offline); download it where it is: hf download {repo} {filename}"
        )
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.CRITICAL)  # its retries' warnings would print lines of their own
    try:
        return Path(hf_hub_download(repo_id=repo, filename=filename))
    except Exception as err:  # noqa: BLE001 (offline, gated, missing: each a reason the user can act on)
        raise SpecError(
            f"model {repo!r}: not in the Hugging Face cache ({hub_cache()}), not fetched "
            f"({type(err).__name__}); download it: hf download {repo} {filename}"
        ) from None
    finally:
        hub_log.setLevel(level)


def repo_of(model: str) -> str | None:
    """The repo id a model name stands for: a preset's, or one read from the cache (its `models--org--name`
    folder); None for a config.json elsewhere."""
    if model in HF_REPO_IDS:
        return HF_REPO_IDS[model]
    folder = next((part for part in Path(model).parts if part.startswith("models--")), None)
    return folder.removeprefix("models--").replace("--", "/", 1) if folder else None


def resolve_repo(repo: str) -> str:
    """A repo id as servesim reads it: its preset's name, or the path of its config.json (cached or fetched)."""
    preset = preset_for_repo(repo)
    if preset is not None:
        return preset
    return str(cached_file(repo) or download_file(repo))
