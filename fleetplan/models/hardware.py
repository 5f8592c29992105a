"""Accelerator spec sheets: the figures the analytic estimator and the example fleets start from.

Every figure is per device (one GPU, one Inferentia2 / Trainium chip, one TPU chip) and comes from the
spec-sheet table in docs/public-figures.md section 4 unless `source` marks it "assumption". Units:
TFLOPS dense BF16/FP16, GiB of device memory, GB/s (1e9 bytes/s) of memory and device-to-device bandwidth,
Gbit/s of NIC bandwidth per device, currency (USD) per device-hour.

Prices are on-demand list prices per device-hour so that device types compare on one footing; where the
only cited price is a reserved-instance rate, `source` says which figure was used and why.
"""

from fleetplan.models.base import Base, CostPerHour, Gib, Name, PositiveGbps
from fleetplan.models.fleet import DeviceKind

GIB_PER_S = 1.073741824  # GB/s in one GiB/s: the Neuron docs quote bandwidth in GiB/s.


class HardwareSpec(Base):
    """One accelerator as the estimator and the example fleets need it.

    `interconnect_gbs` is the per-direction device-to-device bandwidth a tensor-parallel all-reduce runs
    over (NVLink, NeuronLink, ICI, or PCIe where there is nothing faster); `network_gbps` is the per-device
    share of the host NIC that carries KV caches between pools.
    """

    name: Name
    kind: DeviceKind
    bf16_tflops: float
    memory_gib: Gib
    memory_bw_gbs: float
    interconnect_gbs: float
    network_gbps: PositiveGbps
    cost_per_hour: CostPerHour
    source: str


_PCIE4_X16_GBS = 32.0  # 64 GB/s bidirectional (PCIe Gen4 x16), per direction.

HARDWARE: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        HardwareSpec(
            name="a6000ada",
            kind="gpu",
            bf16_tflops=364.0,
            memory_gib=48.0,
            memory_bw_gbs=960.0,
            interconnect_gbs=_PCIE4_X16_GBS,
            network_gbps=25.0,
            cost_per_hour=1.00,
            source=(
                "RTX 6000 Ada: 364 TFLOPS (1,457 FP8-sparse / 4), 48 GB, 960 GB/s, PCIe 4.0 x16 "
                "(grafikkarten.com/de/news/nvidia-rtx-6000-grafikkarte-der-ada-generation, public-figures.md "
                "s4); assumption: 25 Gbit/s NIC per GPU, $1.00/h (typical 2024 GPU-cloud on-demand rate, "
                "not cited)"
            ),
        ),
        HardwareSpec(
            name="inf2",
            kind="inferentia",
            bf16_tflops=190.0,
            memory_gib=32.0,
            memory_bw_gbs=820.0 * GIB_PER_S,
            interconnect_gbs=192.0 * GIB_PER_S,
            network_gbps=100.0 / 12,
            cost_per_hour=12.9813 / 12,
            source=(
                "Inferentia2 chip: 190 TFLOPS, 32 GiB, 820 GiB/s, NeuronLink-v2 192 GiB/s (aws-neuron-sdk "
                "inferentia2.rst, inf2-arch.rst, public-figures.md s4); NIC: inf2.48xlarge 100 Gbit/s / 12 "
                "chips (public-figures.md s4, unverified); assumption: $/h = inf2.48xlarge on-demand list "
                "$12.9813 / 12 (the cited RI-effective rate is $5.608 / 12 = 0.467)"
            ),
        ),
        HardwareSpec(
            name="tpu-v5e",
            kind="tpu",
            bf16_tflops=197.0,
            memory_gib=16.0,
            memory_bw_gbs=819.0,
            interconnect_gbs=200.0,
            network_gbps=25.0,
            cost_per_hour=1.20,
            source=(
                "TPU v5e chip: 197 TFLOPS, 16 GB HBM2, 819 GB/s, ICI 1,600 Gbit/s; host 8 chips with 2 x 100 "
                "Gbit/s NIC -> 25 Gbit/s per chip (cloud.google.com/tpu/docs/v5e, public-figures.md s4); "
                "assumption: $1.20/chip-hour (Cloud TPU on-demand list price, not cited)"
            ),
        ),
        HardwareSpec(
            name="l4",
            kind="gpu",
            bf16_tflops=121.0,
            memory_gib=24.0,
            memory_bw_gbs=300.0,
            interconnect_gbs=_PCIE4_X16_GBS,
            network_gbps=10.0,
            cost_per_hour=0.805,
            source=(
                "L4: 121 TFLOPS, 24 GB, 300 GB/s, PCIe 4.0 x16 (grokipedia.com/page/NVIDIA_L4_vs_L40S "
                "quoting the NVIDIA datasheet, public-figures.md s4); g6.xlarge up to 10 Gbit/s (AWS batch "
                "GPU docs, s4); assumption: $0.805/h (g6.xlarge on-demand list price, not cited)"
            ),
        ),
        HardwareSpec(
            name="a10g",
            kind="gpu",
            bf16_tflops=70.0,
            memory_gib=24.0,
            memory_bw_gbs=600.0,
            interconnect_gbs=_PCIE4_X16_GBS,
            network_gbps=100.0 / 8,
            cost_per_hour=1.01,
            source=(
                "A10G: 70 TFLOPS, 24 GB, 600 GB/s, PCIe 4.0 (cli99/llm-analysis a10g-pcie-24gb.json, "
                "public-figures.md s4); g5.48xlarge 100 Gbit/s / 8 GPUs (AWS batch GPU docs, s4); $1.01/h "
                "(tyler-griggs/melange-release config/example.json, public-figures.md s3)"
            ),
        ),
        HardwareSpec(
            name="a100",
            kind="gpu",
            bf16_tflops=312.0,
            memory_gib=80.0,
            memory_bw_gbs=2039.0,
            interconnect_gbs=300.0,
            network_gbps=50.0,
            cost_per_hour=3.67,
            source=(
                "A100-80GB SXM: 312 TFLOPS, 80 GB HBM2e, 2,039 GB/s, NVLink 600 GB/s bidirectional "
                "(glennklockwood.com/garden/processors/A100, public-figures.md s4); $3.67/h (melange-release "
                "config/example.json, s3); assumption: 50 Gbit/s NIC per GPU (p4d.24xlarge 400 Gbit/s / 8, "
                "not cited)"
            ),
        ),
        HardwareSpec(
            name="h100",
            kind="gpu",
            bf16_tflops=989.0,
            memory_gib=80.0,
            memory_bw_gbs=3350.0,
            interconnect_gbs=450.0,
            network_gbps=400.0,
            cost_per_hour=98.32 / 8,
            source=(
                "H100 SXM: 989 TFLOPS, 80 GB HBM3, 3,350 GB/s, NVLink 900 GB/s bidirectional "
                "(glennklockwood.com/garden/processors/h100, public-figures.md s4); assumption: 400 Gbit/s "
                "NIC per GPU and $12.29/h (p5.48xlarge 3,200 Gbit/s and $98.32/h on-demand, / 8; not cited)"
            ),
        ),
        HardwareSpec(
            name="l40s",
            kind="gpu",
            bf16_tflops=362.05,
            memory_gib=48.0,
            memory_bw_gbs=864.0,
            interconnect_gbs=_PCIE4_X16_GBS,
            network_gbps=50.0,
            cost_per_hour=1.861,
            source=(
                "assumption (not in public-figures.md): L40S 362.05 TFLOPS BF16 dense, 48 GB, 864 GB/s, PCIe "
                "4.0 x16 (NVIDIA datasheet as quoted at mullet.se/product.html?product_id=355414); 50 "
                "Gbit/s NIC and $1.861/h (g6e.48xlarge 400 Gbit/s / 8, g6e.xlarge on-demand; not cited)"
            ),
        ),
        HardwareSpec(
            name="a6000",
            kind="gpu",
            bf16_tflops=154.8,
            memory_gib=48.0,
            memory_bw_gbs=768.0,
            interconnect_gbs=_PCIE4_X16_GBS,
            network_gbps=25.0,
            cost_per_hour=0.80,
            source=(
                "RTX A6000: 154.8 TFLOPS, 48 GB, 768 GB/s, PCIe 4.0 (cli99/llm-analysis a6000-48gb.json, "
                "public-figures.md s4; the pairwise NVLink bridge is ignored); assumption: 25 Gbit/s NIC, "
                "$0.80/h (typical 2024 GPU-cloud on-demand rate, not cited)"
            ),
        ),
        HardwareSpec(
            name="trn1",
            kind="trainium",
            bf16_tflops=190.0,
            memory_gib=32.0,
            memory_bw_gbs=820.0 * GIB_PER_S,
            interconnect_gbs=192.0 * GIB_PER_S,
            network_gbps=800.0 / 16,
            cost_per_hour=21.50 / 16,
            source=(
                "assumption (not in public-figures.md): Trainium chip 190 TFLOPS, 32 GiB, 820 GiB/s; "
                "trn1.32xlarge 16 chips, 800 Gbit/s EFA -> 50 per chip (aws-neuron-sdk trainium.rst, "
                "trn1-arch.rst); NeuronLink-v2 taken equal to inf2's 192 GiB/s; $/h = trn1.32xlarge "
                "on-demand $21.50 / 16 (not cited)"
            ),
        ),
    )
}


def kind_of(name: str, kind: DeviceKind | None) -> DeviceKind | None:
    """A device's kind: the one given, else the catalog's for a device of that name (a request written
    like the contract's example, `{"name": "a6000ada", "count": 4}`, has no `kind`), else None."""
    if kind is not None:
        return kind
    spec = HARDWARE.get(name)
    return None if spec is None else spec.kind


__all__ = ["GIB_PER_S", "HARDWARE", "HardwareSpec", "kind_of"]
