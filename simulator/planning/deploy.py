"""Deployment manifests for a plan's recommendation: plain Kubernetes, llm-d or NVIDIA Dynamo, and the benchmark
commands that measure the deployment, whose saved results `servesim compare` reads back.

Field names follow each project's published schema: Kubernetes' apps/v1 Deployment and v1 Service (and vLLM's
"Deploying with Kubernetes" page: /health probes, a memory-backed /dev/shm); llm-d's modelservice Helm chart
values (llm-d-incubation/llm-d-modelservice charts/llm-d-modelservice/values.yaml); Dynamo's v1alpha1
DynamoGraphDeployment (ai-dynamo/dynamo deploy/cloud/operator/api/v1alpha1). The engine flags are the plan's
launch commands (simulator/planning/launch.py), one set per role.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from servesim.hardware.errors import SpecError
from servesim.hardware.cost import Parallelism
from servesim.hardware.gpu import get_gpu
from servesim.hardware.memory import weight_bytes_per_gpu
from servesim.hardware.model import get_model, resolve_weight_dtype
from servesim.policies.families import GENERIC, SGLANG, VLLM, EngineFamily, family_of
from servesim.simulator.planning.launch import hf_model_id, sglang_command, vllm_command
from servesim.simulator.scenario import Scenario
from servesim.simulator.world.run import pool_settings, workload_of

EMIT_KINDS = ("k8s", "llm-d", "dynamo")
PORT = 8000  # every engine container listens here (SGLang is told to; vLLM's default)


@dataclass(frozen=True)
class EngineLaunch:
    """How a family's launch command (simulator/planning/launch.py) becomes a container: its program's words, where
    the model is named, the flags a pod and a P/D role add, and its public images."""

    command: Callable[[Scenario, int], str]
    program_words: int  # `vllm serve` / `python -m sglang.launch_server`
    model_flag: str | None  # None: the model is the first word after the program
    dynamo_model_flag: str
    pod_flags: tuple[str, ...]  # to listen on the pod's address and PORT
    pd_flags: Callable[[str], list[str]]  # a prefill or decode role's hand-off flags
    image: str
    dynamo_image: str
    on_llm_d: bool  # llm-d's modelservice chart runs vLLM


LAUNCH = {
    VLLM: EngineLaunch(
        vllm_command,
        2,
        None,
        "--model",
        (),
        # vLLM's P/D connector, as the planner's transfer models it (one both-ways role per side)
        lambda role: ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'],
        "vllm/vllm-openai:latest",
        "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.3.0",
        True,
    ),
    SGLANG: EngineLaunch(
        sglang_command,
        3,
        "--model-path",
        "--model-path",
        ("--host", "0.0.0.0", "--port", str(PORT)),
        lambda role: ["--disaggregation-mode", role],
        "lmsysorg/sglang:latest",
        "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.3.0",
        False,
    ),
}


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors: a manifest repeats its labels rather than aliasing them (kubectl and Helm read
    both, people read this)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _yaml(*documents: Any) -> str:
    return yaml.dump_all(documents, Dumper=_PlainDumper, sort_keys=False)


def _env(role: "Role") -> dict[str, Any]:
    return {"env": [{"name": k, "value": v} for k, v in role.env.items()]} if role.env else {}


@dataclass(frozen=True)
class Role:
    """One kind of replica in the deployment: every replica of a colocated plan, or a P/D pool."""

    name: str  # worker, prefill or decode
    replicas: int
    gpus: int  # per replica
    env: dict[str, str]  # the launch command's environment assignments
    argv: list[str]  # the engine's command line, program first


def _argv(command: str) -> tuple[dict[str, str], list[str]]:
    """A launch command's leading VAR=value words as the environment, the rest as argv."""
    words = shlex.split(command)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def family_deployed(s: Scenario) -> EngineFamily:
    """The engine the deployment runs: the family whose scheduler the plan simulated (vLLM's for the schedulers that
    imitate no engine); a SpecError for an engine whose deployments are not written."""
    family = family_of(s.engine.scheduler)
    if family in LAUNCH:
        return family
    if family is not GENERIC:
        raise SpecError(
            f"--emit: {family.label} deployments are not written; run the plan's {family.label} command on your "
            f"servers, or plan with {' or '.join(f.scheduler for f in LAUNCH)} to emit manifests"
        )
    return VLLM


def roles(s: Scenario, max_model_len: int, engine: EngineLaunch) -> list[Role]:
    """The deployment's roles with their engine command lines (P/D: each pool's, with its hand-off flags)."""
    if s.disaggregation is None:
        env, argv = _argv(engine.command(s, max_model_len))
        gpus = s.parallelism.tp * s.parallelism.pp
        return [Role("worker", s.cluster.replicas, gpus, env, argv)]
    out = []
    for name in ("prefill", "decode"):
        pool = getattr(s.disaggregation, name)
        env, argv = _argv(engine.command(pool_settings(s, pool, s.engine.scheduler, name), max_model_len))
        out.append(Role(name, pool.replicas, pool.tp * pool.pp, env, argv + engine.pd_flags(name)))
    return out


def _check_fits_a_node(s: Scenario, all_roles: list[Role]) -> None:
    node = get_gpu(s.hardware.gpu, tuple(s.hardware.gpu_files)).gpus_per_node
    for role in all_roles:
        if role.gpus > node:
            raise SpecError(
                f"--emit: a {role.name} replica of {role.gpus} GPUs spans nodes of {node}; the manifests cover "
                "single-node replicas (multi-node serving needs LeaderWorkerSet or Dynamo's multinode, by hand)"
            )


def _name(s: Scenario) -> str:
    """A DNS-1123 name from the scenario's: lowercase letters, digits and dashes, at most 40 characters."""
    name = "".join(c if c.isalnum() else "-" for c in s.name.lower()).strip("-")
    return ("-".join(filter(None, name.split("-")))[:40].strip("-")) or "servesim"


# a gated checkpoint (Llama, Gemma) downloads only with a Hugging Face token: read from this secret where it exists
HF_TOKEN_ENV = {
    "name": "HF_TOKEN",
    "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}},
}


def _container(role: Role, family: EngineFamily, image: str) -> dict[str, Any]:
    engine = LAUNCH[family]
    argv = [*role.argv, *engine.pod_flags]
    probe = {"httpGet": {"path": "/health", "port": PORT}}
    return {
        "name": family.name,
        "image": image,
        "command": argv[: engine.program_words],
        "args": argv[engine.program_words :],
        "env": [*_env(role).get("env", []), HF_TOKEN_ENV],
        "ports": [{"containerPort": PORT, "name": "http"}],
        "resources": {"limits": {"nvidia.com/gpu": role.gpus}, "requests": {"nvidia.com/gpu": role.gpus}},
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
        "readinessProbe": probe | {"initialDelaySeconds": 60, "periodSeconds": 10},
        "livenessProbe": probe | {"initialDelaySeconds": 600, "periodSeconds": 30},
    }


def k8s_manifests(s: Scenario, all_roles: list[Role], family: EngineFamily, image: str) -> str:
    """A Deployment and a Service: Kubernetes spreads requests over the replicas, as the plan's round robin."""
    if len(all_roles) > 1:
        raise SpecError(
            "--emit k8s: a P/D plan needs a router that pairs prefill and decode replicas; emit llm-d or dynamo"
        )
    (role,) = all_roles
    name, labels = _name(s), {"app.kubernetes.io/name": _name(s), "app.kubernetes.io/part-of": "servesim"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": role.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [_container(role, family, image)],
                    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": PORT}]},
    }
    return _yaml(deployment, service)


def llm_d_values(s: Scenario, all_roles: list[Role], family: EngineFamily, image: str) -> str:
    """Values for llm-d's modelservice chart: a decode role (every replica when colocated) and, under P/D, a
    prefill role, behind llm-d's routing proxy. The chart adds --tensor-parallel-size and the GPU limits."""
    if not LAUNCH[family].on_llm_d:
        raise SpecError(
            f"--emit llm-d: llm-d serves with vLLM; this plan was simulated with {family.label}'s"
        )
    values: dict[str, Any] = {
        "modelArtifacts": {
            "uri": f"hf://{hf_model_id(s.model)}",
            "name": hf_model_id(s.model),
            "size": f"{checkpoint_gib(s)}Gi",  # the volume the download fills (the chart's default: 5Mi)
        },
        "routing": {"servicePort": PORT, "proxy": {"enabled": len(all_roles) > 1, "connector": "nixlv2"}},
    }
    by_name = {role.name: role for role in all_roles}
    for section, role in (
        ("decode", by_name.get("decode", by_name.get("worker"))),
        ("prefill", by_name.get("prefill")),
    ):
        if role is None:
            values[section] = {"create": False}
            continue
        args = role.argv[LAUNCH[family].program_words + 1 :]  # after vllm serve MODEL
        tp = int(args[args.index("--tensor-parallel-size") + 1])
        unsupported = [flag for flag in ("--pipeline-parallel-size", "--data-parallel-size") if flag in args]
        if unsupported:
            raise SpecError(
                f"--emit llm-d: the modelservice chart sizes a pod as data x tensor GPUs; {unsupported[0]} "
                "needs more: emit k8s or dynamo"
            )
        i = args.index("--tensor-parallel-size")
        values[section] = {
            "create": True,
            "replicas": role.replicas,
            "parallelism": {"tensor": tp},
            "containers": [
                {
                    "name": family.name,
                    "image": image,
                    "modelCommand": "vllmServe",
                    "args": args[:i] + args[i + 2 :],
                    **_env(role),
                    "ports": [{"containerPort": PORT, "name": "http"}],
                    "mountModelVolume": True,
                }
            ],
        }
    return _yaml(values)


def checkpoint_gib(s: Scenario) -> int:
    """GiB a volume needs for the checkpoint as published (an engine that quantizes at load downloads it whole),
    with a fifth to spare for its other files (a volume sized to the weights alone is evicted mid-download)."""
    model = get_model(s.model)
    weights = weight_bytes_per_gpu(model, Parallelism(), resolve_weight_dtype(model, "auto"))
    return math.ceil(1.2 * weights / 2**30)


def dynamo_graph(s: Scenario, all_roles: list[Role], family: EngineFamily, image: str) -> str:
    """A DynamoGraphDeployment: Dynamo's frontend and one worker service per role, each a python -m dynamo.<engine>
    process taking the engine's own flags, its P/D role given by Dynamo's own --disaggregation-mode."""
    engine = LAUNCH[family]
    services: dict[str, Any] = {
        "Frontend": {
            "componentType": "frontend",
            "replicas": 1,
            "extraPodSpec": {
                "mainContainer": {
                    "image": image,
                    "command": ["python3", "-m", "dynamo.frontend"],
                    "args": ["--http-port", str(PORT), "--router-mode", "round-robin"],
                }
            },
        }
    }
    for role in all_roles:
        flags = role.argv[engine.program_words + (2 if engine.model_flag else 1) :]
        if role.name != "worker":
            handoff = engine.pd_flags(role.name)
            i = flags.index(handoff[0])
            flags = [*flags[:i], *flags[i + len(handoff) :], "--disaggregation-mode", role.name]
        service: dict[str, Any] = {"componentType": "worker", "replicas": role.replicas}
        if role.name != "worker":
            service["subComponentType"] = role.name
        service |= {
            "resources": {"limits": {"gpu": str(role.gpus)}, "requests": {"gpu": str(role.gpus)}},
            **({"envs": _env(role)["env"]} if role.env else {}),
            "extraPodSpec": {
                "mainContainer": {
                    "image": image,
                    "command": ["python3", "-m", f"dynamo.{family.name}"],
                    "args": [engine.dynamo_model_flag, hf_model_id(s.model), *flags],
                }
            },
        }
        # as Dynamo's examples name them: VllmWorker, VllmPrefillWorker, SglangDecodeWorker
        part = "" if role.name == "worker" else role.name.capitalize()
        services[f"{family.name.capitalize()}{part}Worker"] = service
    graph = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": _name(s)},
        "spec": {"backendFramework": family.name, "services": services},
    }
    return _yaml(graph)


def compare_setup(s: Scenario, replicas: int) -> str:
    """`servesim compare`'s flags for a result file measured on the deployment: what served it, where a result
    file does not say and compare's defaults (vLLM, plain TP, the checkpoint's weights, BF16 KV) are not it."""
    par, e, family = s.parallelism, s.engine, family_of(s.engine.scheduler)
    settings = {
        "replicas": replicas,
        "engine": family.name if family is not GENERIC else VLLM.name,
        "ep": par.ep,
        "dp_attention": par.dp_attention,
        "weight_dtype": e.weight_dtype,
        "kv_dtype": e.kv_dtype,
    }
    defaults = {
        "engine": VLLM.name,
        "ep": False,
        "dp_attention": False,
        "weight_dtype": "auto",
        "kv_dtype": "bf16",
    }
    knobs = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization")
    # compare reads them as the serve command's flags: under DP attention, vLLM's and TensorRT-LLM's are a rank's
    ranks = par.tp if par.dp_attention and family.defaults_per_rank else 1
    for knob in knobs:
        value = getattr(e, knob)
        if value is not None:
            per_rank = knob in ("max_num_seqs", "max_num_batched_tokens")
            settings[f"engine_args.{knob}"] = math.ceil(value / ranks) if per_rank else value
    words = [f"--model {shlex.quote(s.model)}", f"--gpu {s.hardware.gpu}", f"--tp {par.tp}"]
    words += [
        f"--set {key}={str(value).lower() if isinstance(value, bool) else value}"
        for key, value in settings.items()
        if value != defaults.get(key)
    ]
    return " ".join(words)


def benchmark_script(s: Scenario, base_dir: Path, target_rate: float, all_roles: list[Role]) -> str:
    """`vllm bench serve` and GuideLLM at the planned load (Poisson at the target rate, the workload's mean
    lengths) against the deployment's address, and the `servesim compare` line that replays their results on the
    same replicas (a colocated plan: compare replays one kind of engine, not P/D pools). The clients send
    independent requests: a session's turns or a prompt's samples go out as requests of their own, at the rate
    the target's unit makes (sessions/s times turns a session, prompts/s times samples)."""
    workload = workload_of(s, base_dir)
    requests = [*workload.requests, *workload.followups.values()]
    prompt = round(float(np.mean([r.num_prompt_tokens for r in requests])))
    output = round(float(np.mean([r.num_output_tokens for r in requests])))
    model, count = hf_model_id(s.model), len(requests)
    sampling, sessions = s.workload.parallel_sampling, s.workload.sessions
    # requests per unit of the target: a prompt's samples, or a session's turns (its first turns count sessions)
    each = sampling.n if sampling is not None else count / len(workload.requests)
    rate = target_rate * each
    if len(all_roles) == 1:
        setup = compare_setup(s, all_roles[0].replicas)
        then = f"# Then: servesim compare vllm-bench.json {setup}  (and guidellm.json the same way)"
    else:
        then = "# servesim compare replays one kind of engine, not P/D pools: set these beside servesim simulate's"
    send_notes = []
    if sessions is not None:
        send_notes.append(
            f"# ({target_rate:g} sessions/s of {each:.3g} turns, each turn sent as a request of its own)"
        )
    if sampling is not None:
        send_notes.append(
            f"# ({target_rate:g} prompts/s of {each:g} samples, each sent as a request of its own)"
        )
    if send_notes or s.workload.shared_prefix is not None:
        send_notes.append("# Every prompt is random, none shared: the prefix cache hits less than simulated.")
    lines = [
        "#!/usr/bin/env bash",
        f"# Measure the planned deployment: {rate:g} requests/s, Poisson, {count} requests of {prompt} prompt",
        f"# and {output} output tokens (the scenario's means; its spread of lengths is not sent).",
        *send_notes,
        then,
        "set -euo pipefail",
        'URL=${1:?"usage: benchmark.sh URL (the deployment\'s address as the client reaches it)"}',
        f'vllm bench serve --backend openai --base-url "$URL" --model {model} --dataset-name random '
        f"--random-input-len {prompt} --random-output-len {output} --random-range-ratio 0 --ignore-eos "
        f"--num-prompts {count} --request-rate {rate:g} --save-result --save-detailed "
        "--result-filename vllm-bench.json",
        # completions, as vllm bench's openai backend sends (GuideLLM's default, chat, adds a template's tokens)
        f'guidellm benchmark --target "$URL" --model {model} --request-type text_completions --rate-type poisson '
        f"--rate {rate:g} --data prompt_tokens={prompt},output_tokens={output} --max-requests {count} "
        "--output-path guidellm.json",
    ]
    return "\n".join(lines) + "\n"


RENDERERS = {
    "k8s": ("k8s.yaml", k8s_manifests),
    "llm-d": ("modelservice-values.yaml", llm_d_values),
    "dynamo": ("dynamo.yaml", dynamo_graph),
}


def deployment_files(
    kind: str, s: Scenario, base_dir: Path, max_model_len: int, target_rate: float, image: str | None = None
) -> dict[str, str]:
    """File name -> text for the deployment `s` (the recommended scenario, replicas included) under `kind`."""
    if kind not in RENDERERS:
        raise SpecError(f"--emit {kind!r} is not one of {', '.join(EMIT_KINDS)}")
    family = family_deployed(s)
    engine = LAUNCH[family]
    all_roles = roles(s, max_model_len, engine)
    _check_fits_a_node(s, all_roles)
    image = image or (engine.dynamo_image if kind == "dynamo" else engine.image)
    name, render = RENDERERS[kind]
    return {
        name: render(s, all_roles, family, image),
        "benchmark.sh": benchmark_script(s, base_dir, target_rate, all_roles),
    }
