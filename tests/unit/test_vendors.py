"""The vendor table (autoslm/vendors/table.py) is what the spec, the secrets, the catalog and
`plan` without keys read: each answers from ``VENDORS``, never from a list of its own."""

from __future__ import annotations

import pytest

from autoslm import catalog
from autoslm.controller.keyless import ListPriceCatalog, keyless_provider
from autoslm.errors import SpecError
from autoslm.providers import VENDORS, get_provider
from autoslm.providers.base import GpuWish
from autoslm.secrets import SECRET_ENV_VARS
from autoslm.spec import unused_fields, validate_dict


def _spec(**compute):
    raw = {
        "name": "v",
        "model": "autoslm/tiny",
        "environment": {"id": "autoslm/arith"},
        "train": {"method": "sft", "max_steps": 1},
        "compute": compute,
        "artifacts": {"store": "hf", "repo": "me/runs"} if compute.get("provider", "local") != "local" else {},
    }
    return validate_dict(raw)


def test_a_field_no_provider_of_the_run_reads_is_said_and_one_read_by_any_is_not():
    assert unused_fields(_spec(provider="runpod", gpu="RTX 4090", min_reliability=0.9)) == [
        ("compute.min_reliability", "not used here: only Vast reads it, and the run does not use Vast")
    ]
    assert unused_fields(_spec(provider=["runpod", "vast"], gpu="RTX 4090", min_reliability=0.9, cloud="all")) == []
    assert unused_fields(_spec(provider="runpod", gpu="RTX 4090")) == []  # defaults are nobody's choice
    assert [f for f, _ in unused_fields(_spec(provider="vast", gpu="RTX 4090", cloud="community"))] == ["compute.cloud"]


def test_an_unregistered_provider_is_one_issue_naming_the_registered_ones():
    with pytest.raises(SpecError) as info:
        _spec(provider=["runpod", "elsewhere"], gpu="RTX 4090")
    assert [(i.field, i.message) for i in info.value.issues] == [
        ("compute.provider", '"elsewhere" is not a registered provider: write one of ' + ", ".join(f'"{n}"' for n in VENDORS))
    ]
    with pytest.raises(ValueError, match='"elsewhere" is not a registered provider'):
        get_provider("elsewhere")


def test_keys_gpu_ids_and_keyless_prices_come_from_each_vendor():
    for vendor in VENDORS.values():
        assert set(vendor.pod_secret_envs) <= set(SECRET_ENV_VARS)
        assert vendor.key_env is None or vendor.key_env in SECRET_ENV_VARS
        for gpu, vendor_id in vendor.gpu_ids.items():
            assert catalog.gpu_id(vendor.name, gpu) == vendor_id and gpu in catalog.GPUS
        assert set(vendor.list_prices) <= set(vendor.gpu_ids)
        keyless = keyless_provider(vendor)
        assert (keyless is None) == (vendor.capabilities.keyless == "none")
    listed = ListPriceCatalog(VENDORS["runpod"]).offers(GpuWish(gpu_types=("L4", "B200"), gpu_count=2))
    assert [(o.gpu, o.price_per_hour) for o in listed] == [
        ("L4", round(2 * VENDORS["runpod"].list_prices["L4"], 4)),
        ("B200", round(2 * VENDORS["runpod"].list_prices["B200"], 4)),
    ]
    assert VENDORS["runpod"].keyless_note().startswith("catalog price (")
