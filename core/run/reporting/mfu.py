"""Model FLOP utilisation (MFU) of a run: achieved model TFLOP/s per device over the device's peak.

The model's work per sample is counted once at start (``model_flops``); each log row then
turns the window's throughput into ``model_tflops`` (model TFLOP/s per device) and, when
the device's peak is known, ``mfu`` (their ratio). The peak is the dense (not 2:4 sparse)
tensor-core figure of the precision the run computes in: ``--accelerator.mixed_precision``
bf16 or fp16 (or a sharded run's FSDP ``param_dtype`` of bfloat16), else TF32 where torch
lets fp32 matrix products use it, else fp32.
``--accelerator.peak_tflops`` overrides the table, and is the only source on a CPU or a
device the table does not know: there ``mfu`` is left out, and the banner says why once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from lerobot_kit.core.config.schema import AcceleratorConfig
from lerobot_kit.core.run.reporting.banner import human_flops
from lerobot_kit.core.run.reporting.model_flops import SampleFlops

PEAK_FLAG = "--accelerator.peak_tflops"

# Dense peak TFLOP/s per precision, by a pattern of the name torch.cuda.get_device_name gives;
# the first pattern that matches wins, so the more specific names come first. From NVIDIA's
# data sheets and architecture whitepapers; where a data sheet gives only the figure with
# sparsity, half of it. GeForce cards: tensor cores with fp32 accumulation, as torch uses them.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    (r"H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5 ("H100 80GB HBM3")
    (r"H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM
    (r"GH200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),  # SXM4 and PCIe, 40 and 80 GB
    (r"A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),  # not the A10G
    (r"L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    (r"L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"RTX 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    (r"RTX 3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}),
)


def compute_precision(accel: AcceleratorConfig, sharded: bool) -> str:
    """The precision the run's matrix products use: ``bf16``, ``fp16``, ``tf32`` or ``fp32``.
    Autocast's when on; else a sharded run's FSDP ``param_dtype`` of bfloat16 (float16 needs
    fp16 autocast), in which FSDP gathers the parameters and casts the inputs."""
    if accel.mixed_precision in ("bf16", "fp16"):
        return accel.mixed_precision
    if sharded and accel.fsdp.mixed_precision_policy.param_dtype == "bfloat16":
        return "bf16"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def known_peak_tflops(device_name: str, precision: str) -> float | None:
    """The table's dense peak for a GPU of this name; None for a name it does not know and
    for a MIG slice (a fraction of the GPU that the name does not state)."""
    if re.search(r"\bMIG\b", device_name):
        return None
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(rf"\b{pattern}\b", device_name, re.IGNORECASE):
            return peaks[precision]
    return None


@dataclass(frozen=True)
class Peak:
    """A device's peak TFLOP/s and where it came from, or (``tflops`` None) why it is unknown."""

    tflops: float | None
    source: str


def device_peak(accel: AcceleratorConfig, device: torch.device, sharded: bool) -> Peak:
    if accel.peak_tflops is not None:
        return Peak(accel.peak_tflops, PEAK_FLAG)
    precision = compute_precision(accel, sharded)
    if device.type != "cuda":
        return Peak(None, f"no peak known for {device.type.upper()}; give {PEAK_FLAG}")
    name = torch.cuda.get_device_name(device)
    tflops = known_peak_tflops(name, precision)
    if tflops is None:
        return Peak(None, f"no peak known for {name} ({precision}); give {PEAK_FLAG}")
    return Peak(tflops, f"{name}, {precision} dense")


@dataclass(frozen=True)
class Utilization:
    """What turns a log window's throughput into ``model_tflops`` and ``mfu``: fixed at start."""

    flops: SampleFlops
    peak: Peak
    devices: int  # every process of the run computes: the throughput is shared out over them

    def row(self, samples_per_s: float) -> dict[str, float]:
        """The figures of a log row, from the whole run's ``samples_per_s``."""
        if self.flops.per_sample is None:
            return {}
        tflops = self.flops.per_sample * samples_per_s / self.devices / 1e12
        figures = {"model_tflops": tflops}
        if self.peak.tflops is not None:
            figures["mfu"] = tflops / self.peak.tflops
        return figures

    def describe(self) -> str:
        """The banner's line: the FLOPs counted, the peak, and why a figure will be missing."""
        if self.flops.per_sample is None:
            return f"model FLOPs not counted ({self.flops.not_counted}): model_tflops and MFU left out of the log"
        counted = f"model FLOPs {human_flops(self.flops.per_sample)} per sample (forward and backward)"
        if self.peak.tflops is None:
            return f"{counted} | MFU: {self.peak.source}"
        return f"{counted} | peak {self.peak.tflops:g} TFLOP/s per device ({self.peak.source}) for MFU"
