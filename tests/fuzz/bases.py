"""The inputs the fuzzer starts from: every bundled scenario, shrunk to a tiny run whose traces, model config and
GPU file sit beside it, so one case is one self-contained folder."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SCENARIO_FILE = "s.yaml"
TINY_REQUESTS = 12
TRACE_ROWS = 40


@dataclass
class Base:
    """A scenario document and the files it names, relative to its folder."""

    name: str
    doc: dict
    files: dict[str, bytes] = field(default_factory=dict)


def bundled_bases() -> list[Base]:
    """The bundled scenarios, the Vidur benchmark scenario (a model config.json) and a GPU of the user's own file,
    each shrunk to at most TINY_REQUESTS requests over traces cut to TRACE_ROWS rows."""
    paths = sorted((REPO / "scenarios").glob("*.yaml")) + [REPO / "benchmarks" / "vidur_llama2_70b_a100.yaml"]
    bases = [_tiny(path) for path in paths]
    bases.append(_own_gpu(bases[0]))
    return bases


def _tiny(path: Path) -> Base:
    doc = yaml.safe_load(path.read_text())
    doc.pop("sweep", None)
    base = Base(path.stem, doc)
    workload = doc.get("workload", {})
    workload["num_requests"] = min(workload.get("num_requests", TINY_REQUESTS), TINY_REQUESTS)
    workload.pop("duration_s", None)
    for source in _trace_sources(doc):
        original = (path.parent / source["path"]).resolve()
        name = f"trace_{original.name}"
        base.files[name] = b"".join(original.open("rb").readlines()[: TRACE_ROWS + 1])
        source["path"] = name
    model = doc.get("model")
    if isinstance(model, str) and model.endswith(".json"):
        base.files["config.json"] = (path.parent / model).read_bytes()
        doc["model"] = "config.json"
    return base


def _own_gpu(template: Base) -> Base:
    """`template` on a GPU defined in its own file: a copy of the catalog's H100 SXM under another name."""
    catalog = yaml.safe_load((REPO / "hardware" / "catalog" / "gpus.yaml").read_text())
    gpu = copy.deepcopy(next(g for g in catalog["gpus"] if g["name"] == "h100-sxm"))
    gpu["name"] = "my-gpu"
    gpu.pop("sources", None)
    doc = copy.deepcopy(template.doc)
    doc["name"] = "own_gpu"
    doc["hardware"] = {"gpu": "my-gpu", "gpu_files": ["gpus.yaml"]}
    files = dict(template.files)
    files["gpus.yaml"] = yaml.safe_dump({"gpus": [gpu]}, sort_keys=False).encode()
    return Base("own_gpu", doc, files)


def _trace_sources(node: object) -> list[dict]:
    """Every `trace: {format, path}` mapping in a scenario document."""
    found = []
    if isinstance(node, dict):
        if isinstance(node.get("trace"), dict) and "path" in node["trace"]:
            found.append(node["trace"])
        for value in node.values():
            found += _trace_sources(value)
    elif isinstance(node, list):
        for item in node:
            found += _trace_sources(item)
    return found


def write_case(folder: Path, doc_text: str, files: dict[str, bytes]) -> None:
    """One case's folder: the scenario as `s.yaml` and the files it names."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SCENARIO_FILE).write_text(doc_text, encoding="utf-8", errors="surrogateescape")
    for name, data in files.items():
        (folder / name).write_bytes(data)


def as_json_bytes(data: object) -> bytes:
    return json.dumps(data, indent=1).encode()
