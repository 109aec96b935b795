"""The list prices spotorch ships (USD per hour): Compute Engine, read 2026-12-01 from public
copies of Google's Cloud Billing Catalog API. Replace them with `spotorch prices refresh`.

Sources (each Rate names one):
- [C] Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml, generated 2026-07-30 from the
  Catalog API (commit fd66b26): whole machines in us-central1.
- [S] skypilot-org/skypilot-catalog catalogs/v8/gcp/vms.csv (commit 006059e0, an undated
  snapshot): hosts and accelerators by region, priced apart.
- [F] FACTS.md "Prices" (A100, L4 and T4 list prices the project started from).
- [D] cloud.google.com/dataflow/pricing, batch workers, us-central1, as read in 2025 (from
  memory, not re-checked from this machine, which has no internet); other regions differ by a
  few percent: the ledger names us-central1's price standing in for them.
- [P] cloud.google.com/dataproc-serverless/pricing, standard tier, us-central1, as read in 2025
  (from memory, not re-checked here): $0.060 per DCU-hour, shuffle storage $0.040 per GB-month.
- [K] Catalog API SKUs quoted in public SKU fixtures: N1 core $0.031611 per vCPU-hour, N1 RAM
  $0.004237 per GiB-hour (n1-standard-4 = 4 x 0.031611 + 15 x 0.004237 = $0.189999, [C]'s figure).
Where a figure is derived (a total split into unit rates, a host less its GPU), its source says
how. Spot prices change daily and the sources are of different dates: a derived Spot figure can
be off by the difference. Not in the table (an unknown price, never another machine's): C2,
K80, P100, P4, H100 Mega, H200, B200, GB200, RTX PRO 6000, TPU v2 and v3.
"""

from __future__ import annotations

from spotorch.core.prices import (
    DATAFLOW_MEMORY_GB,
    DATAFLOW_PD_GB,
    DATAFLOW_VCPU,
    DATAPROC_DCU,
    DATAPROC_SHUFFLE_GB,
    PriceTable,
    Rate,
    UnitRates,
)

AS_OF = "2026-12-01"
_C = "[C] Cyclenerd pricing.yml 2026-07-30"
_S = "[S] SkyPilot catalog v8 gcp/vms.csv"
US = "us-central1"


def _units(vcpu: tuple[float, float], gib: tuple[float, float], source: str) -> UnitRates:
    return UnitRates(Rate(*vcpu, source, AS_OF), Rate(*gib, source, AS_OF))


FAMILIES = {
    "n1": {US: _units((0.031611, 0.011149), (0.004237, 0.001494),
                      "[K] N1 SKUs; Spot: n1-standard-4's $0.06701 ([C]) split in the on-demand "
                      "ratio")},
    "n2": {US: _units((0.031611, 0.014992), (0.004237, 0.002010),
                      "n2-standard-8 $0.388472 / Spot $0.18424 ([C]), split at the N1 unit rates "
                      "([K]), which reproduce it exactly")},
    "e2": {US: _units((0.02181159, 0.013089), (0.00292353, 0.001754),
                      "e2-standard-4 $0.134023 / Spot $0.080424 ([C]), split at E2's SKU rates "
                      "$0.02181159 / $0.00292353 (from memory; they reproduce the total to "
                      "$0.00001)")},
    "g2": {US: _units((0.024988, 0.021856), (0.002927, 0.002560),
                      "g2-standard-8 $0.853624 / Spot $0.479872 ([C]) less one L4 ([S]), split "
                      "at G2's SKU rates $0.024988 / $0.002927 (from memory; they reproduce the "
                      "host to $0.00002); Spot in the same ratio")},
}


def _host(standard: float, spot: float) -> Rate:
    return Rate(standard, spot, _S + ", host without its GPUs", AS_OF)


# A2 and A3 hosts are priced whole ([S]); their GPUs are the pool's accelerators, priced below.
_A2_REGIONS = {  # region -> (a2-highgpu-1g on demand, Spot); the sizes scale with the GPUs
    "us-central1": (0.73948, 0.36975), "us-east1": (0.73948, 0.36975),
    "us-west1": (0.73948, 0.36975), "us-west3": (0.8882, 0.40554),
    "us-west4": (0.8328, 0.33306), "europe-west4": (0.81406, 0.31824),
    "me-west1": (0.81342, 0.33516), "asia-northeast1": (0.94803, 0.41783),
    "asia-northeast3": (0.94803, 0.34226), "asia-southeast1": (0.9122, 0.41954),
}
_A2_ULTRA_REGIONS = {
    "us-central1": (1.09962, 0.54978), "us-east4": (1.23833, 0.49613),
    "us-east5": (1.09962, 0.31193), "europe-west4": (1.2105, 0.47328),
    "asia-southeast1": (1.35641, 0.62379),
}
_A3_REGIONS = {  # a3-highgpu-1g
    "us-central1": (1.18251, 0.36117), "us-east4": (1.18251, 0.26996),
    "us-east5": (1.33186, 0.29078), "us-west1": (1.18251, 0.36117),
    "us-west4": (1.33186, 0.30467), "europe-west1": (1.30206, 0.29773),
    "europe-west3": (1.39536, 0.31954), "europe-west4": (1.24163, 0.28434),
    "europe-west8": (1.37171, 0.2469), "europe-west9": (1.37171, 0.28246),
    "europe-north1": (1.30206, 0.2022), "asia-east1": (1.36923, 0.34284),
    "asia-northeast1": (1.51858, 0.38002), "asia-south1": (1.22981, 0.28161),
    "asia-south2": (1.42031, 0.32474), "asia-southeast1": (1.45886, 0.34879),
    "australia-southeast1": (1.47813, 0.31187),
}


def _scaled(regions: dict[str, tuple[float, float]], n: int) -> dict[str, Rate]:
    # [S] lists every size; each is n times the 1-GPU host to the cent (checked for A2, A3).
    return {r: _host(round(a * n, 5), round(b * n, 5)) for r, (a, b) in regions.items()}


MACHINES = {
    **{f"a2-highgpu-{n}g": _scaled(_A2_REGIONS, n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": {"us-central1": _host(8.79698, 4.39824),
                       "europe-west4": _host(9.68403, 3.78624),
                       "asia-southeast1": _host(10.85126, 4.99032)},
    **{f"a2-ultragpu-{n}g": _scaled(_A2_ULTRA_REGIONS, n) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": _scaled(_A3_REGIONS, n) for n in (1, 2, 4, 8)},
    # A TPU VM's chip-hour price includes its host.
    **{f"ct5lp-hightpu-{n}t": {"*": Rate(0.0, 0.0, "included in the TPU chip-hour price",
                                          AS_OF)} for n in (1, 4, 8)},
    "ct4p-hightpu-4t": {"*": Rate(0.0, 0.0, "included in the TPU chip-hour price", AS_OF)},
}


def _per_unit(standard: float, spot: float, source: str) -> Rate:
    return Rate(standard, spot, source, AS_OF)


ACCELERATORS = {
    "NVIDIA_TESLA_T4": {US: _per_unit(0.35, 0.175, _S),
                        "europe-west1": _per_unit(0.35, 0.14, "[F] europe-west1")},
    "NVIDIA_TESLA_V100": {US: _per_unit(2.48, 1.0885, _S)},
    "NVIDIA_L4": {US: _per_unit(0.56004, 0.2231, _S)},
    "NVIDIA_TESLA_A100": {US: _per_unit(2.934, 1.147, "[F] us-central1")},
    "NVIDIA_A100_80GB": {US: _per_unit(3.969178, 2.209766,
                                       "a2-ultragpu-1g ([C]) less its host ([S])")},
    "NVIDIA_H100_80GB": {US: _per_unit(9.87874, 5.96502,
                                       "a3-highgpu-1g ([C]) less its host ([S])")},
    "TPU_V5_LITEPOD": {US: _per_unit(1.20, 0.24493, _S + ", per chip (tpu-v5litepod-1)")},
    "TPU_V4_POD": {"us-central2": _per_unit(3.22, 0.9215, _S + ", per chip (tpu-v4-8 / 4)")},
}

_D = "[D] cloud.google.com/dataflow/pricing, batch workers (2025)"
_P = "[P] cloud.google.com/dataproc-serverless/pricing, standard tier (2025)"
DATAFLOW = {  # per vCPU-hour, GB-hour of memory, GB-hour of standard persistent disk
    DATAFLOW_VCPU: {US: Rate(0.056, 0.056, _D, AS_OF)},
    DATAFLOW_MEMORY_GB: {US: Rate(0.003557, 0.003557, _D, AS_OF)},
    DATAFLOW_PD_GB: {US: Rate(0.000054, 0.000054, _D, AS_OF)},
    # [P] Dataproc Serverless for Spark, standard tier, us-central1 (issue 42): $0.060 per
    # DCU-hour; shuffle storage $0.040 per GB-month (730 h). As last read, not re-checked here.
    DATAPROC_DCU: {US: Rate(0.06, 0.06, _P, AS_OF)},
    DATAPROC_SHUFFLE_GB: {US: Rate(0.04 / 730, 0.04 / 730, _P, AS_OF)},
}

# What the table does not price (an unknown price wherever they are used): prefixes of machine
# types and accelerator types of the machine table (spotorch/spec/machines.json).
UNPRICED_MACHINES = ("c2-", "a3-megagpu-", "a3-ultragpu-", "a4-highgpu-", "cloud-tpu")
UNPRICED_ACCELERATORS = frozenset({
    "NVIDIA_TESLA_K80", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_P4", "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H200_141GB", "NVIDIA_B200", "NVIDIA_GB200", "NVIDIA_RTX_PRO_6000", "TPU_V2", "TPU_V3"})

SOURCE = "spotorch's list prices (core/price_list.py; sources [C], [S], [F], [K], [D] there)"

LIST_PRICES = PriceTable(families=FAMILIES, machines=MACHINES, accelerators=ACCELERATORS,
                         dataflow=DATAFLOW, source=SOURCE, as_of=AS_OF)
