"""Pure worker discovery: nvidia-smi parsing, CUDA_VISIBLE_DEVICES filtering, host names."""

from __future__ import annotations

import pytest

from dvml.cluster.workers import gpu_index, parse_nvidia_smi_list, visible_gpus, worker_host

SMI = (
    "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1b2c)\n"
    "  MIG 1g.10gb     Device  0: (UUID: MIG-9a8b)\n"
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-3d4e)\n"
    "\n"
)


def test_parse_nvidia_smi_list_skips_mig_and_blank_lines() -> None:
    assert parse_nvidia_smi_list(SMI) == [
        "GPU 0: NVIDIA H100 80GB HBM3",
        "GPU 1: NVIDIA H100 80GB HBM3",
    ]
    assert parse_nvidia_smi_list("No devices were found\n") == []


@pytest.mark.parametrize(
    ("cuda_visible_devices", "expected"),
    [
        (None, [0, 1]),  # not set: every GPU of the host
        ("", []),  # set empty: none
        ("1", [1]),
        ("1,0", [1, 0]),
        ("7", []),  # an index the host does not have
        ("GPU-3d4e", [0, 1]),  # UUIDs cannot be mapped to the list: keep all
    ],
)
def test_visible_gpus(cuda_visible_devices: str | None, expected: list[int]) -> None:
    gpus = parse_nvidia_smi_list(SMI)
    assert [gpu_index(g) for g in visible_gpus(gpus, cuda_visible_devices)] == expected


def test_gpu_index() -> None:
    assert gpu_index("GPU 12: Tesla V100") == 12
    assert gpu_index("Declared GPU") is None


def test_worker_host_is_dvml_host_else_the_address_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # Buffers and the worker table both record this name, and host rules match it: on a real
    # multi-host cluster the workers of one machine share their address's host, not a port.
    monkeypatch.delenv("DVML_HOST", raising=False)
    assert worker_host("tcp://10.0.0.5:40123") == "10.0.0.5"
    assert worker_host("tcp://10.0.0.5:40999") == "10.0.0.5"
    assert worker_host("tls://[::1]:8786") == "::1"
    monkeypatch.setenv("DVML_HOST", "host-1")
    assert worker_host("tcp://10.0.0.5:40123") == "host-1"
