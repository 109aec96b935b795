"""Price tables: the JSON form, SPOTORCH_PRICES, and `spotorch prices refresh` from the Cloud
Billing Catalog API (a local HTTP server in the API's shape: SKUs paged by nextPageToken, an
API key required, Google's JSON error body)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from spotorch.core.cost import hourly_rate
from spotorch.core.errors import ConfigError
from spotorch.core.pipeline import Capacity, JobTemplate, Pipeline, Trigger, WorkerPool
from spotorch.core.price_catalog import table_from_skus, unit_price
from spotorch.core.price_list import LIST_PRICES
from spotorch.operate.prices import main as prices_main
from spotorch.spec.prices import PRICES_ENV, load_table, price_table, table_doc, table_from_doc

KEY = "test-api-key-123"


def sku(sku_id: str, description: str, group: str, usage: str, regions: list[str],
        nanos: int, unit: str = "h", units: str = "0") -> dict[str, Any]:
    """A SKU as the Catalog API returns it (fields from the API reference)."""
    return {
        "name": f"services/6F81-5844-456A/skus/{sku_id}", "skuId": sku_id,
        "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                     "resourceGroup": group, "usageType": usage},
        "serviceRegions": regions,
        "pricingInfo": [{"summary": "", "effectiveTime": "2026-11-01T00:00:00Z",
                         "pricingExpression": {
                             "usageUnit": unit, "usageUnitDescription": "hour",
                             "baseUnit": "s", "baseUnitConversionFactor": 3600,
                             "displayQuantity": 1,
                             "tieredRates": [{"startUsageAmount": 0, "unitPrice": {
                                 "currencyCode": "USD", "units": units, "nanos": nanos}}]},
                         "aggregationInfo": {"aggregationLevel": "ACCOUNT",
                                             "aggregationInterval": "DAILY",
                                             "aggregationCount": 1},
                         "currencyConversionRate": 1}],
        "serviceProviderName": "Google"}


SKUS = [
    sku("2E27-4F75-95CD", "N1 Predefined Instance Core running in Americas", "N1Standard",
        "OnDemand", ["us-central1", "us-east1"], 31611000),
    sku("A1", "Spot Preemptible N1 Predefined Instance Core running in Americas", "N1Standard",
        "Preemptible", ["us-central1", "us-east1"], 6655000),
    sku("A2", "N1 Predefined Instance Ram running in Americas", "N1Standard", "OnDemand",
        ["us-central1", "us-east1"], 4237000, unit="GiBy.h"),
    sku("A3", "Spot Preemptible N1 Predefined Instance Ram running in Americas", "N1Standard",
        "Preemptible", ["us-central1", "us-east1"], 892000, unit="GiBy.h"),
    sku("A88A-5A60-E821", "Nvidia L4 GPU running in Iowa", "GPU", "OnDemand", ["us-central1"],
        560040000),
    sku("AEC2-3D5C-61BF", "Nvidia L4 GPU attached to Spot Preemptible VMs running in Iowa", "GPU",
        "Preemptible", ["us-central1"], 223100000),
    # A commitment, and a SKU in a unit spotorch does not read: both left out.
    sku("C1", "Commitment v1: N1 Predefined Instance Core in Americas for 1 Year", "N1Standard",
        "Commit1Yr", ["us-central1"], 19900000),
    sku("G1", "G2 Instance Core running in Iowa", "CPU", "OnDemand", ["us-central1"], 24988000,
        unit="mo"),
    # Only on demand: half a part is never priced.
    sku("E1", "E2 Instance Core running in Americas", "CPU", "OnDemand", ["us-central1"],
        21811590),
]


class Catalog(BaseHTTPRequestHandler):
    """GET /v1/services/{service}/skus, two SKUs a page, an API key required."""

    pages_served: list[str] = []

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if self.headers.get("x-goog-api-key") != KEY and query.get("key", [""])[0] != KEY:
            return self._reply(403, {"error": {
                "code": 403, "status": "PERMISSION_DENIED",
                "message": "Method doesn't allow unregistered callers (callers without "
                           "established identity). Please use API Key or other form of API "
                           "consumer identity to call this API."}})
        if url.path != "/v1/services/6F81-5844-456A/skus":
            return self._reply(404, {"error": {"code": 404, "status": "NOT_FOUND",
                                               "message": "Service not found"}})
        start = int(query.get("pageToken", ["0"])[0] or 0)
        self.pages_served.append(str(start))
        page: dict[str, Any] = {"skus": SKUS[start:start + 2]}
        if start + 2 < len(SKUS):
            page["nextPageToken"] = str(start + 2)
        else:
            page["nextPageToken"] = ""
        return self._reply(200, page)

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def catalog() -> Iterator[str]:
    Catalog.pages_served = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Catalog)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def n1(machine: str = "n1-standard-4", **pool: Any) -> Pipeline:
    return Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/",
                    output_uri="gs://m/",
                    job=JobTemplate(worker_pools=(WorkerPool(machine_type=machine, **pool),)))


def test_a_sku_s_price_is_its_latest_pricing_s_first_tier() -> None:
    assert unit_price(SKUS[0]) == (0.031611, "h")
    assert unit_price({"pricingInfo": []}) is None


def test_the_catalog_s_skus_become_unit_rates_and_accelerators() -> None:
    table, notes = table_from_skus(SKUS, as_of="2026-12-01", source="catalog")
    assert set(table.families) == {"n1"} and set(table.families["n1"]) == {"us-central1",
                                                                        "us-east1"}
    units = table.families["n1"]["us-central1"]
    assert (units.vcpu.standard, units.vcpu.spot) == (0.031611, 0.006655)
    assert (units.gib.standard, units.gib.spot) == (0.004237, 0.000892)
    assert table.accelerators["NVIDIA_L4"]["us-central1"].spot == pytest.approx(0.2231)
    assert any("G1" in n and "'mo'" in n for n in notes)
    assert any(n.startswith("e2 vcpu in us-central1: only ['standard']") for n in notes)


def test_refresh_writes_a_table_that_prices_every_cost_once_named(
        catalog: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "prices.json"
    monkeypatch.setenv("SPOTORCH_BILLING_API_KEY", KEY)
    assert prices_main(["refresh", "--out", str(out), "--endpoint", catalog]) == 0
    assert Catalog.pages_served == ["0", "2", "4", "6", "8"]  # every page followed
    table = price_table({PRICES_ENV: str(out)})
    rate = hourly_rate(n1(), Capacity.SPOT, "us-east1", table)
    assert rate.per_hour == pytest.approx(4 * 0.006655 + 15 * 0.000892)
    assert any("2E27-4F75-95CD" in b or "A1" in b for b in rate.basis)
    # TPU prices are carried over from the shipped table (their SKUs are another service's)
    assert table.accelerators["TPU_V5_LITEPOD"] == LIST_PRICES.accelerators["TPU_V5_LITEPOD"]
    # a machine the refreshed table does not know is an unknown price, not the old list price
    assert hourly_rate(n1("e2-standard-4"), Capacity.SPOT, "us-central1", table).per_hour is None


def test_refresh_without_a_key_says_which_variable_and_changes_nothing(
        catalog: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SPOTORCH_BILLING_API_KEY", raising=False)
    out = tmp_path / "prices.json"
    assert prices_main(["refresh", "--out", str(out), "--endpoint", catalog]) == 1
    assert "set SPOTORCH_BILLING_API_KEY" in capsys.readouterr().err and not out.exists()


def test_a_refused_key_is_the_api_s_own_error_and_never_the_key(
        catalog: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPOTORCH_BILLING_API_KEY", "wrong-key-456")
    assert prices_main(["refresh", "--out", str(tmp_path / "p.json"), "--endpoint",
                        catalog]) == 1
    err = capsys.readouterr().err
    assert "PERMISSION_DENIED" in err and "wrong-key-456" not in err


def test_the_shipped_table_round_trips_through_its_json_form() -> None:
    again = table_from_doc(json.loads(json.dumps(table_doc(LIST_PRICES))))
    assert again == LIST_PRICES


def test_a_table_without_dataflow_prices_keeps_the_shipped_ones_and_a_typo_is_refused() -> None:
    doc = table_doc(LIST_PRICES)
    assert doc.get("dataflow")
    del doc["dataflow"]  # a file written before the section existed
    assert table_from_doc(doc).dataflow == LIST_PRICES.dataflow
    rate = {"standard": 0.06, "spot": 0.06, "source": "mine", "as_of": "2026-12-01"}
    with pytest.raises(ConfigError) as caught:
        table_from_doc({"dataflow": {"batch_cpu": {"us-central1": rate}}})
    assert [p.path for p in caught.value.problems] == ["dataflow"]
    assert "batch_cpu" in str(caught.value) and "batch_vcpu" in str(caught.value)


def test_a_bad_table_lists_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({
        "families": {"n1": {"us-central1": {"vcpu": {"standard": -1, "spot": 0.01,
                                                     "source": "x", "as_of": "2026-12-01"},
                                            "gib": "cheap"}}},
        "accelerators": {"NVIDIA_L4": {"us-central1": {"standard": 0.5, "spot": True,
                                                       "source": "", "as_of": "yesterday"}}}}))
    with pytest.raises(ConfigError) as caught:
        load_table(path)
    paths = sorted(p.path for p in caught.value.problems)
    assert paths == ["accelerators.NVIDIA_L4.us-central1.as_of",
                     "accelerators.NVIDIA_L4.us-central1.source",
                     "accelerators.NVIDIA_L4.us-central1.spot",
                     "families.n1.us-central1.gib", "families.n1.us-central1.vcpu.standard"]


def test_show_names_the_price_and_its_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert prices_main(["show", "g2-standard-8", "--accelerator", "NVIDIA_L4"]) == 0
    out = capsys.readouterr().out
    assert "standard: $0.8536/h" in out and "g2 rates" in out
    assert prices_main(["show", "c2-standard-8"]) == 0
    assert "unknown price (no price for machine c2-standard-8)" in capsys.readouterr().out
