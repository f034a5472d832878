"""`autoslm plan`'s table: every cell whole and every line inside the terminal, at 80 and 120 columns.

.venv/bin/python -m pytest tests/unit/test_plan_view.py -q
"""

from __future__ import annotations

import pytest

from autoslm.views.plan import COLUMNS, plan_table

BASIS = "{steps} steps x ~{s} s + 9 min setup (MFU 30%)"
CATALOG = "catalog price (2026-11 list; set RUNPOD_API_KEY for live offers)"


def row(
    provider,
    gpu,
    price,
    *,
    count=1,
    usable=True,
    fits=True,
    need=13.9,
    has=24.0,
    hours=2.2,
    est=1.0,
    most=5.0,
    note=None,
    location="catalog",
    reliability=None,
):
    return {
        "provider": provider,
        "gpu": gpu,
        "gpu_count": count,
        "vram_gb": has,
        "price_per_hour": price,
        "interruptible": False,
        "fits": fits,
        "vram_need_gb": need,
        "est_hours": hours,
        "estimated_cost_usd": est,
        "max_cost_usd": most,
        "usable": usable,
        "note": note if note is not None else BASIS.format(steps=300, s=25.1),
        "location": location,
        "reliability": reliability,
        "offer_id": None,
        "failover_rank": 0,
        "replicas": 1,
    }


def rows() -> list[dict]:
    return [
        row("runpod", "L4", 0.43, est=0.96, note=f"{CATALOG}; " + BASIS.format(steps=300, s=21.0)),
        row("runpod", "RTX 4090", 0.69, est=1.10, note=f"{CATALOG}; " + BASIS.format(steps=300, s=12.3)),
        row("runpod", "A100 80GB PCIe", 1.64, count=2, est=3.5, hours=0.4, note=f"{CATALOG}; " + BASIS.format(steps=300, s=3.2)),
        row(
            "vast",
            "RTX 4090",
            0.35,
            est=0.80,
            location="Norway, NO",
            reliability=0.995,
            note="public offer search (no VAST_API_KEY); " + BASIS.format(steps=300, s=12.3),
        ),
        row(
            "vast",
            "RTX PRO 6000 WS",
            1.2,
            usable=False,
            est=12.0,
            most=5.0,
            location="Texas, US",
            reliability=0.97,
            note="public offer search (no VAST_API_KEY); estimated $12.00 is over limits.max_usd = $5",
        ),
        row(
            "vast",
            "RTX 3060",
            0.09,
            usable=False,
            fits=False,
            need=13.9,
            has=12.0,
            location="Quebec, CA",
            reliability=0.96,
            note="public offer search (no VAST_API_KEY); model needs ~13.9 GB per GPU, RTX 3060 has 12 GB",
        ),
    ]


@pytest.mark.parametrize("width", [80, 120])
def test_every_cell_whole_and_no_line_wider_than_the_terminal(width):
    data = rows()
    text = plan_table(data, width, title="offers for grpo (Qwen/Qwen3-0.6B)")
    lines = text.splitlines()
    assert all(len(x) <= width for x in lines), [x for x in lines if len(x) > width]
    assert "…" not in text
    table = lines[1 : lines.index(next(x for x in lines if x.startswith("> the offer")))]
    header = table[0]
    for h in ("provider", "GPU", "$/hour", "GB need/has", "est. cost", "max cost"):
        assert h in header, (h, header)
    for r in data:  # each offer on one line, with its cells whole
        gpu = (f"{r['gpu_count']}x " if r["gpu_count"] > 1 else "") + r["gpu"]
        assert [x for x in table if gpu in x and r["provider"] in x and f"{r['price_per_hour']:.3f}" in x], (gpu, text)
    assert len(table) == 2 + len(data) + 1  # header, rule, one line per offer, "not usable:"
    if width >= 120:
        assert "location" in header and "Norway, NO" in text
    else:
        assert "location" not in header


def test_sorted_by_estimate_chosen_marked_unusable_after_with_a_word_and_notes_once():
    text = plan_table(rows(), 80)
    lines = text.splitlines()
    body = [x for x in lines if x.lstrip("> ").startswith(("runpod", "vast"))]
    costs = [float(x.split("$")[1].split()[0]) for x in body[:4]]
    assert costs == sorted(costs), body
    assert lines.index("not usable:") > max(lines.index(x) for x in body[:4])
    chosen = [x for x in body if x.startswith(">")]
    assert len(chosen) == 1 and "runpod" in chosen[0] and "L4" in chosen[0]  # failover order: runpod first
    assert "no-fit" in body[-1] or "no-fit" in body[-2]
    assert any("budget" in x for x in body[-2:])
    assert text.count("catalog price") == 1 and "runpod: catalog price" in text
    assert text.count("public offer search") == 1 and "vast: public offer search" in text
    assert text.count("each GPU's estimated step time") == 1  # the shared basis, said once
    assert "budget: estimated $12.00 is over limits.max_usd" in text.replace("\n  ", " ")
    assert "MFU 30%" in text.replace("\n  ", " ") and "25.1" not in text


def test_a_narrow_terminal_loses_columns_not_cell_ends():
    data = [row("vast", "RTX PRO 6000 Blackwell", 1.2, count=8, est=123.45, most=999.99)]
    text = plan_table(data, 70)
    assert all(len(x) <= 70 for x in text.splitlines()), text
    assert "8x RTX PRO 6000 Blackwell" in text and "$123.45" in text and "$999.99" in text
    assert "est. time" not in text.splitlines()[0]
    assert {c[0] for c in COLUMNS} >= {"provider", "GPU", "$/hour", "est. cost", "max cost"}
