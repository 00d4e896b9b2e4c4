"""GPU profiles: peak dense bf16/fp16 tensor throughput, memory and bandwidths.

Units: ``peak_tflops`` is dense (no sparsity) bf16/fp16 tensor-core TFLOP/s;
``nvlink_gbps`` is one GPU's *per-direction* bandwidth to its node peers in
Gbit/s; ``network_gbps`` is the per-GPU inter-node bandwidth (one NIC rail per
GPU, as in DGX-style clusters) in Gbit/s.

``efficiency`` is the fraction of peak a well-tuned Megatron-style transformer
layer reaches (model FLOPs utilisation). 0.45 is in the range reported by
Narayanan et al., SC'21 ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM"): 44-52% of A100 peak. Calibration may refit it.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_EFFICIENCY = 0.45


@dataclass(frozen=True, kw_only=True)
class GpuProfile:
    name: str
    peak_tflops: float
    memory_gb: float
    nvlink_gbps: float
    network_gbps: float
    intra_cluster_latency_ms: float
    efficiency: float = DEFAULT_EFFICIENCY
    source: str = ""

    @property
    def achieved_flops(self) -> float:
        """FLOP/s one GPU delivers at its profile efficiency."""
        return self.peak_tflops * 1e12 * self.efficiency


GPUS: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        # NVIDIA Tesla V100 datasheet (SXM2): 125 TFLOP/s tensor, 32 GB HBM2,
        # NVLink 300 GB/s total (150 GB/s per direction); DGX-2: EDR 100 Gb/s per GPU.
        GpuProfile(name="v100", peak_tflops=125.0, memory_gb=32.0, nvlink_gbps=1200.0,
                   network_gbps=100.0, intra_cluster_latency_ms=0.005,
                   source="NVIDIA V100 datasheet (SXM2)"),
        # NVIDIA A100 datasheet (SXM4): 312 TFLOP/s bf16 dense, NVLink 600 GB/s total;
        # DGX A100: 8x HDR 200 Gb/s.
        GpuProfile(name="a100-40gb", peak_tflops=312.0, memory_gb=40.0, nvlink_gbps=2400.0,
                   network_gbps=200.0, intra_cluster_latency_ms=0.005,
                   source="NVIDIA A100 datasheet (SXM4 40GB)"),
        GpuProfile(name="a100-80gb", peak_tflops=312.0, memory_gb=80.0, nvlink_gbps=2400.0,
                   network_gbps=200.0, intra_cluster_latency_ms=0.005,
                   source="NVIDIA A100 datasheet (SXM4 80GB)"),
        # NVIDIA H100 datasheet (SXM5): 989 TFLOP/s bf16 dense (1,979 with sparsity),
        # 80 GB HBM3, NVLink 900 GB/s total; DGX H100: 8x NDR 400 Gb/s.
        GpuProfile(name="h100", peak_tflops=989.0, memory_gb=80.0, nvlink_gbps=3600.0,
                   network_gbps=400.0, intra_cluster_latency_ms=0.004,
                   source="NVIDIA H100 datasheet (SXM5)"),
        # NVIDIA L40S datasheet: 362 TFLOP/s bf16 dense (733 with sparsity), 48 GB,
        # no NVLink: PCIe Gen4 x16 (32 GB/s per direction); 100 GbE per GPU assumed.
        GpuProfile(name="l40s", peak_tflops=362.0, memory_gb=48.0, nvlink_gbps=256.0,
                   network_gbps=100.0, intra_cluster_latency_ms=0.010,
                   source="NVIDIA L40S datasheet"),
        # NVIDIA Ada Lovelace whitepaper, RTX 4090: 165.2 TFLOP/s fp16/bf16 tensor with
        # fp32 accumulate (dense), 24 GB GDDR6X, PCIe Gen4 x16; 25 GbE per GPU assumed.
        GpuProfile(name="rtx4090", peak_tflops=165.2, memory_gb=24.0, nvlink_gbps=256.0,
                   network_gbps=25.0, intra_cluster_latency_ms=0.020,
                   source="NVIDIA Ada GPU architecture whitepaper (RTX 4090)"),
    )
}


def gpu_profile(name: str) -> GpuProfile:
    """The profile called ``name``; KeyError lists the known ones."""
    try:
        return GPUS[name]
    except KeyError:
        raise KeyError(f"unknown GPU type {name!r}; known: {', '.join(sorted(GPUS))}") from None
