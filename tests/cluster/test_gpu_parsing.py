"""Pure GPU discovery: nvidia-smi parsing and CUDA_VISIBLE_DEVICES filtering."""

from __future__ import annotations

import pytest

from dvml.cluster.workers import gpu_index, parse_nvidia_smi_list, visible_gpus

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
