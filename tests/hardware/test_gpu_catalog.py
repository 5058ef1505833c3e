"""The bundled GPU/interconnect catalog loads, carries sources, and user YAML files extend it safely."""

from pathlib import Path

import pytest

from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import COMPUTE_DTYPES, get_gpu, get_interconnect, gpu_catalog, interconnects

REQUIRED_GPUS = (
    "a100-40gb-pcie",
    "a100-80gb",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "b200",
    "b300",
    "gb200",
    "gb300",
    "l40s",
    "l4",
    "mi300x",
    "mi325x",
    "mi355x",
)

NEW_GPU_YAML = """\
gpus:
  - name: test-accel
    vendor: acme
    memory_bytes: 64.0e+9
    memory_bytes_per_s: 2.0e+12
    peak_flop_per_s:
      fp32: 50.0e+12
      bf16: 400.0e+12
    intra_node_link: pcie5
    pcie_gen: 5
    gpus_per_node: 4
    price_per_gpu_hour_usd: 1.5
    sources: ["made up for a test"]
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_catalog_gpu_loads_with_a_source():
    catalog = gpu_catalog()
    assert catalog
    for name, spec in catalog.items():
        assert spec.name == name
        assert spec.sources and all(s.strip() for s in spec.sources), name
        assert spec.notes.strip(), name
        assert set(spec.peak_flop_per_s) <= set(COMPUTE_DTYPES)


def test_required_gpus_exist():
    catalog = gpu_catalog()
    missing = [name for name in REQUIRED_GPUS if name not in catalog]
    assert not missing


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_reported_memory_lies_between_the_datasheet_gb_and_the_same_number_of_gib(name):
    """Drivers expose the binary capacity less ECC and firmware reservations (HBM), or a little under the
    decimal figure (GDDR: L40S, L4); a value outside this band is a typo."""
    gpu = get_gpu(name)
    assert gpu.device_memory_bytes is not None
    assert 0.97 * gpu.memory_bytes < gpu.reported_memory_bytes < gpu.memory_bytes * (1 << 30) / 1e9


def test_h100_reports_81090_mib_and_a_user_gpu_without_a_reported_total_uses_its_datasheet(tmp_path):
    assert get_gpu("h100-sxm").reported_memory_bytes == 85_028_896_768
    path = tmp_path / "mine.yaml"
    path.write_text(NEW_GPU_YAML)
    assert get_gpu("test-accel", (path,)).reported_memory_bytes == pytest.approx(64e9)


def test_every_intra_node_link_resolves():
    for spec in gpu_catalog().values():
        link = get_interconnect(spec.intra_node_link)
        assert link.name == spec.intra_node_link
        assert link.bytes_per_s > 0


def test_interconnects_have_sources_and_known_kinds():
    links = interconnects()
    for name in (
        "nvlink3",
        "nvlink4",
        "nvlink5",
        "nvlink-bridge-a100",
        "nvlink-bridge-h100",
        "xgmi-mi300x",
        "xgmi-mi355x",
        "pcie3",
        "pcie4",
        "pcie5",
        "pcie6",
        "ib-hdr-200",
        "ib-ndr-400",
        "ib-xdr-800",
        "roce-200",
        "roce-400",
        "roce-800",
    ):
        assert name in links
    for link in links.values():
        assert link.kind in {"nvlink", "xgmi", "pcie", "infiniband", "roce"}
        assert link.source.strip()
    assert links["nvlink4"].bytes_per_s == pytest.approx(450e9)
    assert links["ib-ndr-400"].bytes_per_s == pytest.approx(50e9)


def test_a100_40gb_pcie_fp32_ridge_point():
    assert get_gpu("a100-40gb-pcie").ridge_point("fp32") == pytest.approx(12.54, abs=0.01)


def test_h200_bf16_ridge_point():
    assert get_gpu("h200").ridge_point("bf16") == pytest.approx(989.5e12 / 4.8e12, abs=1)
    assert get_gpu("h200").ridge_point() == pytest.approx(206, abs=1)


def test_peaks_are_dense_not_sparse():
    # NVIDIA prints sparse figures with an asterisk; the catalog holds half of them.
    assert get_gpu("h100-sxm").peak_for("bf16") == pytest.approx(989.5e12)
    assert get_gpu("h100-sxm").peak_for("fp8") == pytest.approx(1979e12)
    assert get_gpu("b200").peak_for("fp4") == pytest.approx(9e15)


def test_peak_fallbacks():
    a100 = get_gpu("a100-80gb")
    assert a100.peak_for("fp8") == a100.peak_for("bf16")  # no FP8 on Ampere: falls back
    # no FP4 tensor cores on Hopper: FP4 weights run dequantized to bf16 (vLLM's Marlin W4A16), not on FP8 cores
    assert get_gpu("h100-sxm").peak_for("fp4") == get_gpu("h100-sxm").peak_for("bf16")


def test_unknown_gpu_lists_the_nearest_known_names():
    """The nearest names and where to find the rest: the whole catalog would run the line past 200 characters."""
    with pytest.raises(SpecError) as err:
        get_gpu("h300")
    assert "h300" in str(err.value)
    assert "h200" in str(err.value) and "more: servesim hardware list)" in str(err.value)
    assert len(str(err.value)) < 120
    with pytest.raises(SpecError, match="unknown GPU 'h100-sxn'; did you mean 'h100-sxm'"):
        get_gpu("h100-sxn")


def test_user_file_adds_gpu(tmp_path):
    path = _write(tmp_path, "mine.yaml", NEW_GPU_YAML)
    catalog = gpu_catalog((path,))
    assert "test-accel" in catalog
    assert "h200" in catalog
    spec = get_gpu("test-accel", (path,))
    assert spec.ridge_point("bf16") == pytest.approx(200)
    assert spec.memory_bytes == pytest.approx(64e9)


def test_user_file_missing_field_names_file_and_field(tmp_path):
    text = NEW_GPU_YAML.replace("    memory_bytes_per_s: 2.0e+12\n", "")
    path = _write(tmp_path, "broken.yaml", text)
    with pytest.raises(SpecError) as err:
        gpu_catalog((path,))
    message = str(err.value)
    assert str(path) in message
    assert "memory_bytes_per_s" in message


def test_a_check_of_a_whole_user_gpu_names_the_gpu_without_a_dangling_field(tmp_path):
    path = _write(tmp_path, "nofp32.yaml", NEW_GPU_YAML.replace("      fp32: 50.0e+12\n", ""))
    with pytest.raises(SpecError) as err:
        gpu_catalog((path,))
    assert str(err.value).startswith(f"{path}: gpus[test-accel]: peak_flop_per_s must list 'fp32'"), str(
        err.value
    )
    assert "missing.yaml: gpus[test-accel].memory_bytes_per_s: " in _missing_field_message(tmp_path)


def _missing_field_message(tmp_path: Path) -> str:
    path = _write(tmp_path, "missing.yaml", NEW_GPU_YAML.replace("    memory_bytes_per_s: 2.0e+12\n", ""))
    with pytest.raises(SpecError) as err:
        gpu_catalog((path,))
    return str(err.value)


def test_user_file_unknown_field_is_rejected(tmp_path):
    path = _write(tmp_path, "extra.yaml", NEW_GPU_YAML + "    tdp_watts: 700\n")
    with pytest.raises(SpecError) as err:
        gpu_catalog((path,))
    assert "tdp_watts" in str(err.value)


def test_user_file_may_not_shadow_catalog(tmp_path):
    path = _write(tmp_path, "shadow.yaml", NEW_GPU_YAML.replace("name: test-accel", "name: h100-sxm"))
    with pytest.raises(SpecError) as err:
        gpu_catalog((path,))
    assert "h100-sxm" in str(err.value)
    assert str(path) in str(err.value)


def test_user_file_with_unknown_link_is_rejected(tmp_path):
    path = _write(
        tmp_path, "badlink.yaml", NEW_GPU_YAML.replace("intra_node_link: pcie5", "intra_node_link: warp")
    )
    with pytest.raises(SpecError) as err:
        gpu_catalog((path,))
    assert "warp" in str(err.value)


def test_missing_user_file(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        gpu_catalog((tmp_path / "nope.yaml",))
