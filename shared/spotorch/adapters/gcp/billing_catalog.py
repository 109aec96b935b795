"""Google's Cloud Billing Catalog API (v1): the public list prices of a service's SKUs.

`GET {endpoint}/v1/services/{service}/skus?currencyCode=USD&pageSize=5000&pageToken=...`, authenticated
by an API key (`key=`; public prices need no IAM permission) or an OAuth access token. Pages are
followed until `nextPageToken` is absent or empty. Errors come back as Google's JSON error body
({"error": {"code", "message", "status"}}) and are raised with its status and message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

from spotorch.core.errors import SpotorchError

ENDPOINT = "https://cloudbilling.googleapis.com"
PAGE_SIZE = 5000  # the API's most per page


class CatalogError(SpotorchError):
    """The Catalog API refused or failed (its status and message, never the key)."""


class BillingCatalog:
    """Reads the SKUs of a service, page by page."""

    def __init__(self, *, api_key: str | None = None, access_token: str | None = None,
                 endpoint: str = ENDPOINT, timeout_s: float = 60.0) -> None:
        if not api_key and not access_token:
            raise CatalogError("the Catalog API needs an API key or an access token")
        self._key, self._token = api_key, access_token
        self.endpoint, self.timeout_s = endpoint.rstrip("/"), timeout_s

    def _get(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        query = dict(params)
        headers = {"Accept": "application/json"}
        if self._key:
            headers["x-goog-api-key"] = self._key
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        url = f"{self.endpoint}{path}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body: dict[str, Any] = json.loads(response.read())
                return body
        except urllib.error.HTTPError as exc:
            raise CatalogError(f"Catalog API {path}: {_error_of(exc)}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise CatalogError(f"Catalog API {path}: {type(exc).__name__}: {exc}") from None

    def skus(self, service: str, currency: str = "USD") -> Iterator[dict[str, Any]]:
        """Every SKU of the service, in the API's order."""
        token = ""
        while True:
            params = {"currencyCode": currency, "pageSize": str(PAGE_SIZE)}
            if token:
                params["pageToken"] = token
            page = self._get(f"/v1/services/{service}/skus", params)
            yield from page.get("skus") or ()
            token = str(page.get("nextPageToken") or "")
            if not token:
                return


def _error_of(exc: urllib.error.HTTPError) -> str:
    try:
        error = json.loads(exc.read()).get("error") or {}
        return f"{error.get('status') or exc.code}: {error.get('message') or exc.reason}"
    except (ValueError, AttributeError, OSError):
        return f"HTTP {exc.code} {exc.reason}"
