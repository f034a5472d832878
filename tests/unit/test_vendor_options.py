"""A vendor's own JobSpec settings live in its folder: it declares a model of them (``Vendor.options``),
the JobSpec validates ``[compute.options.<vendor>]`` with it, the wish carries the object, and the
vendor's provider reads its own. A vendor defined here, handed to the spec as its vendor table (as
vendors/table.py hands every vendor), shows that a new vendor's setting needs no other file."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict

from autoslm.controller.placement import gpu_wish, plan_placement
from autoslm.errors import SpecError
from autoslm.providers import VENDORS
from autoslm.providers.base import Offer
from autoslm.spec import JobSpec, unused_fields, validate_dict
from autoslm.vendors.vendor import Capabilities, Vendor


class ToyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lane: Literal["slow", "fast"] = "slow"


TOY = Vendor(
    name="toy",
    title="Toy Cloud",
    provider_class=f"{__name__}:ToyProvider",
    capabilities=Capabilities(not_interruptible="toy pods are never taken away"),
    key_env="TOY_API_KEY",
    options=f"{__name__}:ToyOptions",
)
WITH_TOY = {**VENDORS, "toy": TOY}


class ToyProvider:
    """Its offers' price and id say which lane its own option asked for."""

    name = "toy"

    def __init__(self):
        self.asked = []

    def offers(self, wish, *, lookup: bool = False) -> list[Offer]:
        self.asked.append(wish)
        lane = TOY.options_in(wish).lane
        return [Offer("toy", "RTX 4090", wish.gpu_count, 24, 0.2 if lane == "slow" else 0.9, offer_id=lane)]


def _raw(provider: str = "toy", **compute) -> dict:
    return {
        "name": "opts",
        "model": "autoslm/tiny",
        "environment": {"id": "autoslm/arith"},
        "train": {"method": "sft", "max_steps": 10},
        "compute": {"provider": provider, "gpu": "RTX 4090", **compute},
        "artifacts": {"store": "hf", "repo": "me/runs"},
    }


def test_a_vendors_own_option_is_validated_by_its_model_and_reaches_its_providers_wish():
    spec = validate_dict(_raw(options={"toy": {"lane": "fast"}}), vendors=WITH_TOY)
    assert spec.compute.options == {"toy": ToyOptions(lane="fast")}
    provider = ToyProvider()
    placement = plan_placement(spec, {"toy": provider})  # the wish `plan` and a launch ask with
    assert [p.offer_id for p in placement.offers] == ["fast"]
    assert TOY.options_in(provider.asked[0]) == ToyOptions(lane="fast")
    # Not written: the vendor's defaults.
    assert ToyProvider().offers(gpu_wish(validate_dict(_raw(), vendors=WITH_TOY).compute))[0].offer_id == "slow"


def test_a_bad_option_is_one_line_at_its_place_in_the_vendors_table():
    with pytest.raises(SpecError) as info:
        validate_dict(_raw(options={"toy": {"lane": "warp", "speed": 3}}), vendors=WITH_TOY)
    issues = {i.field: i.message for i in info.value.issues}
    assert set(issues) == {"compute.options.toy.lane", "compute.options.toy.speed"}
    assert "'slow' or 'fast'" in issues["compute.options.toy.lane"] and "unknown key" in issues["compute.options.toy.speed"]
    assert all("\n" not in m for m in issues.values())
    with pytest.raises(SpecError, match=r"Hugging Face Jobs has no options: remove \[compute.options.hfjobs\]"):
        validate_dict(_raw("hfjobs", gpu="L4", options={"hfjobs": {}}))


def test_the_registry_is_not_changed_by_a_table_handed_to_one_spec():
    assert "toy" not in VENDORS
    with pytest.raises(SpecError) as info:
        validate_dict(_raw(options={"toy": {"lane": "fast"}}))
    assert {i.field for i in info.value.issues} == {"compute.provider", "compute.options"}
    assert all('"toy" is not a registered provider' in i.message for i in info.value.issues)


def test_an_option_of_a_vendor_the_run_does_not_use_is_named_where_it_was_written():
    spec = validate_dict(_raw("runpod", options={"toy": {"lane": "fast"}}, cloud="all"), vendors=WITH_TOY)
    assert unused_fields(spec) == [
        ("compute.options.toy.lane", "not used here: only Toy Cloud reads it, and the run does not use Toy Cloud")
    ]
    vast = validate_dict(_raw("vast", cloud="all", options={"runpod": {}}))
    assert [f for f, _ in unused_fields(vast)] == ["compute.cloud"]


def test_the_options_written_at_computes_top_level_are_still_read_as_their_vendors():
    old = validate_dict(_raw("runpod", cloud="community", min_reliability=0.98))
    new = validate_dict(_raw("runpod", options={"runpod": {"cloud": "community"}, "vast": {"min_reliability": 0.98}}))
    assert old.to_json() == new.to_json()
    wish = gpu_wish(old.compute)
    assert VENDORS["runpod"].options_in(wish).cloud == "community" and VENDORS["vast"].options_in(wish).min_reliability == 0.98
    with pytest.raises(SpecError, match="compute.cloud is also set as compute.options.runpod.cloud: keep the second"):
        validate_dict(_raw("runpod", cloud="all", options={"runpod": {"cloud": "community"}}))
    with pytest.raises(SpecError, match="compute.options.vast.min_reliability"):
        validate_dict(_raw("vast", min_reliability=2))
    # A run recorded before the table (its JSON has both fields at compute's top level, as every default) reads back.
    recorded = json.loads(validate_dict(_raw("vast")).to_json())
    recorded["compute"].pop("options")
    recorded["compute"].update(cloud="secure", min_reliability=0.95)
    back = JobSpec.from_json(json.dumps(recorded)).compute
    assert back.options["runpod"].cloud == "secure" and back.options["vast"].min_reliability == 0.95
