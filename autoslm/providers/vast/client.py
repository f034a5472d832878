"""Vast's REST API (/api/v0 and /api/v1), one method per endpoint autoslm uses: vendor JSON in and
out, ``http.py``'s errors raised. Only ``provider.py`` (and the pod's own end, ``selfterm.py``) talk through it."""

from __future__ import annotations

import json
from typing import Any

from autoslm.errors import ProviderUnavailable
from autoslm.providers.http import ApiClient

PAGE_LIMIT = 25
MAX_PAGES = 200


class VastApi:
    """Vast REST, one method per endpoint we use. Returns vendor JSON; raises http.py errors."""

    def __init__(self, client: ApiClient):
        self.client = client

    def search_offers(self, query: dict, *, lookup: bool = False) -> list[dict]:
        resp = self.client.call("POST", "/api/v0/bundles/", json=query, what="searching offers", lookup=lookup)
        return list((resp.json() or {}).get("offers") or [])

    def create_instance(self, offer_id: int | str, body: dict) -> dict:
        resp = self.client.call(
            "PUT",
            f"/api/v0/asks/{offer_id}/",
            json=body,
            what=f"renting offer {offer_id} for {body.get('label')}",
            idempotent=False,
        )
        return resp.json() or {}

    def get_instance(self, instance_id: str) -> dict | None:
        resp = self.client.call(
            "GET", f"/api/v0/instances/{instance_id}/", params={"owner": "me"}, what=f"reading instance {instance_id}"
        )
        return (resp.json() or {}).get("instances")

    def destroy_instance(self, instance_id: str) -> dict:
        resp = self.client.call("DELETE", f"/api/v0/instances/{instance_id}/", what=f"destroying instance {instance_id}")
        try:
            return resp.json() or {}
        except ValueError:
            return {}

    def list_instances(self, select_filters: dict | None = None) -> list[dict]:
        """Every page of /api/v1/instances/ (25 a page, following next_token)."""
        params: dict[str, Any] = {
            "select_filters": json.dumps(select_filters or {}),
            "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
            "limit": PAGE_LIMIT,
        }
        out: list[dict] = []
        for _ in range(MAX_PAGES):
            data = self.client.call("GET", "/api/v1/instances/", params=params, what="listing instances").json() or {}
            out += list(data.get("instances") or [])
            token = data.get("next_token")
            if not token:
                return out
            params["after_token"] = token
        raise ProviderUnavailable(
            f"Vast listed more than {MAX_PAGES * PAGE_LIMIT} instances without an end", hint="try again later"
        )
