"""`servesim plan --emit`: manifests whose every field is one the target's schema documents, carrying the planned
replicas, GPU counts and engine flags, and command lines the engines' documented parsers accept."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servesim.hardware.errors import SpecError
from servesim.simulator.cli.main import app
from servesim.simulator.compare.measured import runs_from_file, scenario_for
from servesim.simulator.planning.deploy import compare_setup, deployment_files
from servesim.simulator.planning.launch import COMMANDS
from servesim.simulator.scenario import load_scenario
from servesim.simulator.world.run import workload_of
from tests.simulator.engine_flags import (
    dynamo_frontend_parser,
    refusal,
    sglang_parser,
    trtllm_inline_options,
    trtllm_parser,
    vllm_parser,
)

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
runner = CliRunner()

# Allowed keys, from each schema's documentation. A dict maps a field to its own schema; a one-item list is a list
# of that schema; ANY is a free-form map or a scalar.
ANY = None
ENV = [{"name": ANY, "value": ANY}]
K8S_ENV = [
    {"name": ANY, "value": ANY, "valueFrom": {"secretKeyRef": {"name": ANY, "key": ANY, "optional": ANY}}}
]
PORTS = [{"containerPort": ANY, "name": ANY}]
# Kubernetes API reference (v1.31): apps/v1 Deployment, core/v1 Container, Volume, Service
CONTAINER = {
    "name": ANY,
    "image": ANY,
    "command": [ANY],
    "args": [ANY],
    "env": K8S_ENV,
    "ports": PORTS,
    "resources": {"limits": ANY, "requests": ANY},
    "volumeMounts": [{"name": ANY, "mountPath": ANY}],
    "readinessProbe": {
        "httpGet": {"path": ANY, "port": ANY},
        "initialDelaySeconds": ANY,
        "periodSeconds": ANY,
    },
    "livenessProbe": {
        "httpGet": {"path": ANY, "port": ANY},
        "initialDelaySeconds": ANY,
        "periodSeconds": ANY,
    },
}
METADATA = {"name": ANY, "labels": ANY}
K8S = {
    "Deployment": {
        "apiVersion": ANY,
        "kind": ANY,
        "metadata": METADATA,
        "spec": {
            "replicas": ANY,
            "selector": {"matchLabels": ANY},
            "template": {
                "metadata": METADATA,
                "spec": {
                    "containers": [CONTAINER],
                    "volumes": [{"name": ANY, "emptyDir": {"medium": ANY, "sizeLimit": ANY}}],
                },
            },
        },
    },
    "Service": {
        "apiVersion": ANY,
        "kind": ANY,
        "metadata": METADATA,
        "spec": {"selector": ANY, "ports": [{"name": ANY, "port": ANY, "targetPort": ANY}]},
    },
}
# llm-d-incubation/llm-d-modelservice charts/llm-d-modelservice/values.yaml
MODELSERVICE_ROLE = {
    "create": ANY,
    "replicas": ANY,
    "parallelism": {"tensor": ANY, "data": ANY, "dataLocal": ANY, "workers": ANY},
    "containers": [
        {
            "name": ANY,
            "image": ANY,
            "modelCommand": ANY,
            "args": [ANY],
            "env": ENV,
            "ports": PORTS,
            "mountModelVolume": ANY,
        }
    ],
}
MODELSERVICE = {
    "modelArtifacts": {"uri": ANY, "name": ANY, "size": ANY},
    "routing": {"servicePort": ANY, "proxy": {"enabled": ANY, "connector": ANY}},
    "decode": MODELSERVICE_ROLE,
    "prefill": MODELSERVICE_ROLE,
}
# ai-dynamo/dynamo deploy/cloud/operator/api/v1alpha1: DynamoGraphDeployment, DynamoComponentDeploymentSharedSpec
DYNAMO_SERVICE = {
    "componentType": ANY,
    "subComponentType": ANY,
    "replicas": ANY,
    "resources": {"limits": {"gpu": ANY}, "requests": {"gpu": ANY}},
    "envs": ENV,
    "extraPodSpec": {"mainContainer": {"image": ANY, "command": [ANY], "args": [ANY]}},
}
DYNAMO = {
    "apiVersion": ANY,
    "kind": ANY,
    "metadata": {"name": ANY},
    "spec": {"backendFramework": ANY, "services": ANY},
}


def unknown_fields(document, schema, path="") -> list[str]:
    """Paths of the keys `document` has and `schema` does not."""
    if schema is ANY:
        return []
    if isinstance(schema, list):
        return [f for i, item in enumerate(document) for f in unknown_fields(item, schema[0], f"{path}[{i}]")]
    assert isinstance(document, dict), path
    return [
        found
        for key, value in document.items()
        for found in (
            [f"{path}.{key}"] if key not in schema else unknown_fields(value, schema[key], f"{path}.{key}")
        )
    ]


def emitted(kind: str, scenario: str, *overrides: str, max_model_len: int = 8192, **kw) -> tuple[list, str]:
    s, base = load_scenario(ROOT / "scenarios" / scenario, ["workload.num_requests=40", *overrides])
    files = deployment_files(kind, s, base, max_model_len, 6.0, **kw)
    (name,) = set(files) - {"benchmark.sh"}
    return list(yaml.safe_load_all(files[name])), files["benchmark.sh"]


def test_k8s_carries_the_planned_replicas_gpus_and_flags_in_fields_kubernetes_defines():
    (deployment, service), script = emitted(
        "k8s", "chat_llama70b_h100x4.yaml", "cluster.replicas=3", "parallelism.tp=4"
    )
    assert [unknown_fields(d, K8S[d["kind"]]) for d in (deployment, service)] == [[], []]
    assert deployment["spec"]["replicas"] == 3
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 4}
    # Llama is gated: the token comes from secret hf-token where it exists (optional: the pod starts without it)
    assert container["env"][-1] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}},
    }
    assert container["command"] == ["vllm", "serve"]
    args = container["args"]
    assert args[:3] == ["meta-llama/Llama-3.1-70B", "--tensor-parallel-size", "4"]
    assert refusal(vllm_parser(), args) is None
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["containerPort"]
    assert "--request-rate 6 " in script and "--set replicas=3" in script


def test_sglang_plans_run_sglang_listening_on_the_containers_port():
    (deployment, _), _ = emitted(
        "k8s", "chat_llama8b_h100.yaml", "engine.scheduler=sglang", "engine.prefix_caching=radix"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert (
        container["image"].startswith("lmsysorg/sglang")
        and container["command"][-1] == "sglang.launch_server"
    )
    assert refusal(sglang_parser(), container["args"]) is None
    assert container["args"][-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    (graph,), _ = emitted(
        "dynamo", "chat_llama8b_h100.yaml", "engine.scheduler=sglang", "engine.prefix_caching=radix"
    )
    worker = graph["spec"]["services"]["SglangWorker"]
    assert graph["spec"]["backendFramework"] == "sglang" and unknown_fields(worker, DYNAMO_SERVICE) == []
    assert refusal(sglang_parser(), worker["extraPodSpec"]["mainContainer"]["args"]) is None


def test_pd_plans_need_a_pd_router_and_get_each_pools_replicas_and_role_flags():
    with pytest.raises(SpecError, match="needs a router that pairs prefill and decode replicas"):
        emitted("k8s", "pd_disaggregated_70b.yaml")
    (values,), script = emitted(
        "llm-d",
        "pd_disaggregated_70b.yaml",
        "disaggregation.prefill.replicas=2",
        "disaggregation.decode.tp=8",
    )
    assert unknown_fields(values, MODELSERVICE) == [] and values["routing"]["proxy"]["enabled"] is True
    # the download's volume: 70.55e9 BF16 weights are 131.4 GiB, a fifth more to spare (the chart's default 5Mi
    # volume is evicted mid-download)
    assert values["modelArtifacts"]["size"] == "158Gi"
    (quantized,), _ = emitted("llm-d", "pd_disaggregated_70b.yaml", "engine.weight_dtype=fp8")
    assert quantized["modelArtifacts"]["size"] == "158Gi"  # quantized at load: the BF16 checkpoint is fetched
    prefill, decode = values["prefill"], values["decode"]
    assert (prefill["replicas"], prefill["parallelism"]["tensor"]) == (2, 4)
    assert (decode["replicas"], decode["parallelism"]["tensor"]) == (1, 8)
    for role in (prefill, decode):
        args = role["containers"][0]["args"]  # the chart adds the model and --tensor-parallel-size
        assert refusal(vllm_parser(), [values["modelArtifacts"]["name"], *args]) is None
        assert json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector"] == "NixlConnector"
    assert "not P/D pools" in script

    (graph,), _ = emitted("dynamo", "pd_disaggregated_70b.yaml", "disaggregation.prefill.replicas=2")
    assert unknown_fields(graph, DYNAMO) == []
    services = graph["spec"]["services"]
    assert all(unknown_fields(service, DYNAMO_SERVICE) == [] for service in services.values())
    assert (
        refusal(dynamo_frontend_parser(), services["Frontend"]["extraPodSpec"]["mainContainer"]["args"])
        is None
    )
    workers = {s["subComponentType"]: s for s in services.values() if s["componentType"] == "worker"}
    assert (workers["prefill"]["replicas"], workers["decode"]["replicas"]) == (2, 1)
    assert workers["decode"]["resources"]["limits"]["gpu"] == "4"
    for role, service in workers.items():
        args = service["extraPodSpec"]["mainContainer"]["args"]
        assert refusal(vllm_parser(dynamo=True), args) is None
        assert args[-2:] == ["--disaggregation-mode", role] and "--kv-transfer-config" not in args


def test_what_a_target_cannot_express_is_refused_with_the_reason():
    with pytest.raises(SpecError, match="spans nodes of 8"):
        emitted("k8s", "chat_llama70b_h100x4.yaml", "parallelism.tp=8", "parallelism.pp=2")
    with pytest.raises(SpecError, match="--pipeline-parallel-size needs more"):
        emitted("llm-d", "chat_llama70b_h100x4.yaml", "parallelism.pp=2", "parallelism.tp=2")
    with pytest.raises(SpecError, match="llm-d serves with vLLM; this plan was simulated with SGLang.s"):
        emitted("llm-d", "chat_llama8b_h100.yaml", "engine.scheduler=sglang", "engine.prefix_caching=radix")
    with pytest.raises(
        SpecError, match="TensorRT-LLM deployments are not written; run the plan's TensorRT-LLM"
    ):
        emitted("k8s", "chat_llama8b_h100.yaml", "engine.scheduler=trtllm")
    with pytest.raises(SpecError, match="--emit 'helm' is not one of k8s, llm-d, dynamo"):
        emitted("helm", "chat_llama8b_h100.yaml")


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_bundled_scenarios_launch_commands_parse_with_the_engines_flags(path):
    s, _ = load_scenario(path, [])
    if s.stages:
        pytest.skip("a multi-stage pipeline has no launch command")
    parsers = {"vllm": (vllm_parser, 2), "sglang": (sglang_parser, 3), "trtllm": (trtllm_parser, 1)}
    assert set(parsers) == {family.name for family in COMMANDS}
    for family, command in COMMANDS.items():
        words = shlex.split(command(s, 8192))
        words = [w for w in words if not ("=" in w and w.split("=")[0].isupper())]  # environment assignments
        words, _ = trtllm_inline_options(words)
        parser, program_words = parsers[family.name]
        assert refusal(parser(), words[program_words:]) is None, (family.name, command(s, 8192))


def test_the_engine_parsers_refuse_what_the_engines_would():
    assert "unrecognized arguments: --max-num-seq 8" in refusal(vllm_parser(), ["m", "--max-num-seq", "8"])
    assert "invalid choice" in refusal(sglang_parser(), ["--model-path", "m", "--kv-cache-dtype", "fp8"])
    assert "unrecognized arguments: --max-batch-size" in refusal(
        trtllm_parser(), ["m", "--max-batch-size", "8"]
    )
    with pytest.raises(Exception, match="unknown LLM API options"):
        trtllm_inline_options(
            ["m", "--extra_llm_api_options", "<(echo", '{"kv_cache_config": {"reuse": 1}})']
        )


def test_plan_emit_writes_the_recommended_deployment(tmp_path):
    out = tmp_path / "k8s"
    args = ["plan", str(ROOT / "scenarios" / "quickstart.yaml"), "--gpus", "h100-sxm", "--tp", "1"]
    args += ["--max-replicas", "2", "--set", "workload.num_requests=120", "--out", str(tmp_path / "plan")]
    result = runner.invoke(app, [*args, "--emit", "k8s", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    deployment, _ = yaml.safe_load_all((out / "k8s.yaml").read_text())
    assert deployment["spec"]["replicas"] == plan["recommendation"]["replicas"]
    assert (out / "benchmark.sh").stat().st_mode & 0o111
    bad = runner.invoke(app, [*args, "--emit", "helm", str(out)])
    assert bad.exit_code == 2 and "--emit 'helm' is not one of k8s, llm-d, dynamo" in bad.output


def test_the_benchmark_sends_every_request_at_the_rate_the_targets_unit_makes():
    """6 sessions/s of agent turns (40 requests in 14 sessions) are 6 x 40 / 14 requests/s, every turn counted;
    6 prompts/s of 8 rollouts each are 48 requests/s. GuideLLM sends completions, as vllm bench's client does."""
    s, base = load_scenario(ROOT / "scenarios" / "agent_prefix_sharing.yaml", ["workload.num_requests=40"])
    workload = workload_of(s, base)
    sessions, count = len(workload.requests), len(workload.requests) + len(workload.followups)
    assert (sessions, count) == (14, 40)
    _, script = emitted("k8s", "agent_prefix_sharing.yaml")
    assert f"--num-prompts 40 --request-rate {6 * 40 / 14:g} " in script
    assert f"--rate {6 * 40 / 14:g} " in script and "--max-requests 40 " in script
    assert "each turn sent as a request of its own" in script and "prefix cache hits less" in script
    _, script = emitted("k8s", "grpo_rollouts.yaml")
    assert "--num-prompts 40 --request-rate 48 " in script and "8 samples, each sent" in script
    guidellm = next(line for line in script.splitlines() if line.startswith("guidellm"))
    assert "--request-type text_completions" in guidellm


def test_the_scripts_compare_line_replays_the_result_on_the_planned_engine_and_layout(tmp_path):
    """The result file does not say which engine served it, nor its layout or dtypes: the hint does, so the replay
    runs SGLang's scheduler for an SGLang plan, not compare's default vLLM."""
    from tests.simulator.test_measured import vllm_result

    _, script = emitted(
        "k8s",
        "chat_llama8b_h100.yaml",
        "engine.scheduler=sglang",
        "engine.prefix_caching=radix",
        "engine.max_num_seqs=96",
    )
    hint = next(line for line in script.splitlines() if "servesim compare" in line)
    words = shlex.split(hint.split("servesim compare vllm-bench.json", 1)[1].split("(and")[0])
    flags = dict(zip(words[::2], words[1::2])) | {"--set": None}
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    (run,) = runs_from_file(vllm_result(tmp_path), flags["--model"], flags["--gpu"], int(flags["--tp"]), sets)
    assert (run.engine, run.replicas, run.model) == ("sglang", 1, "llama-3.1-8b")
    assert (run.engine_args.max_num_seqs, run.engine_args.max_model_len) == (96, 16384)


def test_the_compare_line_states_a_dp_attention_ranks_limits_as_its_serve_flags(tmp_path):
    """Under DP attention vllm serve takes each rank's limits, and compare reads the line's as such: 256 slots over
    8 ranks are 32 a rank on the line, 256 again in the replay."""
    from tests.simulator.test_measured import vllm_result

    s, _ = load_scenario(ROOT / "scenarios" / "deepseek_v3_8xh200.yaml", ["engine.max_num_seqs=256"])
    words = shlex.split(compare_setup(s, 1))
    assert "engine_args.max_num_seqs=32" in words
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    (run,) = runs_from_file(vllm_result(tmp_path), "deepseek-v3", "h200", 8, sets)
    assert scenario_for(run).engine.max_num_seqs == 256
