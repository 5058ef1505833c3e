"""Models by Hugging Face id or folder: presets by repo id, snapshot folders, the local cache, a fetch, and one line
when none of them has it."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servesim.hardware import hf_models
from servesim.hardware.errors import SpecError
from servesim.hardware.hf_models import HF_ALIASES, HF_REPO_IDS, repo_of
from servesim.hardware.model import PRESET_DIR, get_model, preset_names, resolve_model_name
from servesim.simulator.cli.main import app
from servesim.simulator.planning.launch import hf_model_id

ROOT = Path(__file__).resolve().parents[2]
#: A model no preset holds (Qwen3-8B's config with 31 layers), as a user's download would be.
NO_PRESET = {**json.loads((PRESET_DIR / "qwen3-8b.json").read_text()), "num_hidden_layers": 31}


def _cache(root: Path, repo: str, revision: str, config: dict, main: bool = True) -> Path:
    """A huggingface_hub cache entry for `repo` holding `config` in snapshot `revision`."""
    folder = root / f"models--{repo.replace('/', '--')}"
    path = folder / "snapshots" / revision / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(config))
    if main:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / "main").write_text(revision)
    return path


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    get_model.cache_clear()
    yield tmp_path / "hub"
    get_model.cache_clear()


def test_every_preset_has_its_repo_and_each_repo_or_alias_resolves_to_its_preset():
    assert sorted(HF_REPO_IDS) == preset_names()
    for preset, repo in HF_REPO_IDS.items():
        assert resolve_model_name(repo) == preset and repo_of(preset) == repo
    for repo, preset in HF_ALIASES.items():
        assert resolve_model_name(repo.upper()) == preset  # the Hub matches ids without regard to case


def test_an_instruct_repo_id_is_its_base_preset():
    model = get_model("meta-llama/Llama-3.1-8B-Instruct")
    assert model == get_model("llama-3.1-8b")
    assert model.name == "llama-3.1-8b"


def test_a_snapshot_folder_is_read_through_its_config_json(tmp_path):
    folder = tmp_path / "My-Model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(NO_PRESET))
    assert resolve_model_name(str(folder)) == str(folder / "config.json")
    model = get_model(str(folder))
    assert model.name == "My-Model" and model.num_layers == 31
    assert get_model(str(folder / "config.json")).name == "My-Model"  # a config.json is named by its folder


def test_a_cached_repo_reads_the_snapshot_refs_main_names_else_the_newest(hub):
    wanted = _cache(hub, "acme/Tiny-MoE", "bbb", NO_PRESET)
    _cache(hub, "acme/Tiny-MoE", "aaa", {**NO_PRESET, "num_hidden_layers": 2}, main=False)
    assert resolve_model_name("acme/Tiny-MoE") == str(wanted)
    assert resolve_model_name("ACME/tiny-moe") == str(wanted)
    assert get_model("acme/Tiny-MoE").num_layers == 31
    assert get_model(str(wanted)).name == "acme/Tiny-MoE"
    assert hf_model_id(str(wanted)) == "acme/Tiny-MoE"  # the launch command names the repo, not the file
    (hub / "models--acme--Tiny-MoE" / "refs" / "main").unlink()
    newest = _cache(hub, "acme/Tiny-MoE", "ccc", NO_PRESET, main=False)
    assert resolve_model_name("acme/Tiny-MoE") == str(newest)


def test_a_repo_not_cached_is_fetched_with_huggingface_hub(hub, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    fetched = []

    def download(repo_id, filename):
        fetched.append((repo_id, filename))
        return str(_cache(hub, repo_id, "fff", NO_PRESET))

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    assert get_model("acme/fetched").num_layers == 31
    assert fetched == [("acme/fetched", "config.json")]


def test_offline_and_not_cached_is_one_line_saying_where_it_looked_and_what_to_run(hub, monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecError) as err:
        resolve_model_name("acme/absent")
    message = str(err.value)
    assert str(hub) in message and "hf download acme/absent config.json" in message
    default = message.replace(str(hub), str(Path("~/.cache/huggingface/hub").expanduser()))
    assert "\n" not in message and len(default) <= 200  # one line with the default cache's path
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    with pytest.raises(SpecError, match=r"not in the Hugging Face cache .*\[hf\]"):
        resolve_model_name("acme/absent")


def test_a_name_that_is_none_of_them_lists_the_presets():
    with pytest.raises(SpecError, match=r"unknown model 'llama3'; presets: .* or HF id\)"):
        resolve_model_name("llama3")
    assert not hf_models.is_repo_id("a/" + "b" * 3000)  # too long for a repo id, and for a path


def _scenario(tmp_path: Path, model: str) -> Path:
    raw = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    raw["model"], raw["workload"]["num_requests"] = model, 40
    raw["workload"]["trace"]["path"] = str(ROOT / "scenarios" / raw["workload"]["trace"]["path"])
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B-Instruct", "downloads/tiny-moe"])
def test_simulate_takes_a_repo_id_or_a_snapshot_folder_beside_the_scenario(tmp_path, model, hub):
    folder = tmp_path / "downloads" / "tiny-moe"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(NO_PRESET))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["simulate", str(_scenario(tmp_path, model)), "--out", str(out)])
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load((out / "scenario.yaml").read_text())["model"]
    assert resolved == ("llama-3.1-8b" if model.startswith("meta") else str(folder / "config.json"))
    assert json.loads((out / "summary.json").read_text())["completed"] == 40
    shutil.rmtree(out)


def test_without_a_network_the_fetch_is_not_tried_for_half_a_minute(hub, monkeypatch):
    """huggingface_hub retries a dead connection for ~25 s; a host name that does not resolve means offline now."""
    import socket

    pytest.importorskip("huggingface_hub")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def no_dns(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(
        SpecError, match=r"the Hub is not reachable \(offline\); .* hf download acme/far config.json"
    ):
        resolve_model_name("acme/far")
