"""The [sweep] table: a grid (or a random draw from it) of full JobSpecs, every problem of every point at
once naming its point; and the registry's sweep tables, added to an older file without touching its runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoslm.errors import SpecError
from autoslm.sweep import expand, is_sweep_file, load_sweep

REPO = Path(__file__).resolve().parents[2]


def base(**sweep) -> dict:
    return {
        "name": "s",
        "model": "autoslm/tiny",
        "seed": [0, 1],
        "environment": {"id": "autoslm/arith"},
        "train": {"method": "sft", "max_steps": 10, "batch_size": 8},
        "sweep": sweep,
    }


def test_the_grid_is_the_product_and_the_seeds_replicate_every_point():
    sw = expand(base(**{"train.learning_rate": [1e-4, 3e-4, 1e-3], "train.lora_rank": [16, 64]}, max_parallel=2))
    assert len(sw.points) == 6 and sw.settings.max_parallel == 2 and sw.seeds == [0, 1]
    assert {(p.spec.train.learning_rate, p.spec.train.lora_rank) for p in sw.points} == {
        (lr, r) for lr in (1e-4, 3e-4, 1e-3) for r in (16, 64)
    }
    members = sw.members()
    assert len(members) == 12 and {m[2].seed for m in members} == {0, 1}
    assert members[0][2].name == "s-p0" and members[-1][2].name == "s-p5"
    assert sw.points[1].label == "learning_rate=0.0001 lora_rank=64"


def test_random_mode_draws_samples_from_the_grid_repeatably():
    raw = base(
        **{"train.learning_rate": [1e-4, 2e-4, 3e-4, 4e-4], "train.lora_rank": [8, 16, 32]},
        mode="random",
        samples=5,
        sampling_seed=7,
    )
    a, b = expand(raw), expand(raw)
    assert len(a.points) == 5 and [p.values for p in a.points] == [p.values for p in b.points]
    assert len({tuple(p.values.items()) for p in a.points}) == 5
    with pytest.raises(SpecError, match="sweep.samples: 13 is more than the 12 points"):
        expand({**raw, "sweep": {**raw["sweep"], "samples": 13}})


def test_every_problem_of_every_point_is_reported_at_once_naming_the_point():
    with pytest.raises(SpecError) as info:
        expand(base(**{"train.learning_rate": [1e-4, -1.0], "train.batch_size": [8, 0], "train.lora_rnk": [4]}), "sw.toml")
    text = str(info.value)
    lines = text.splitlines()
    # Point 0 (lr 1e-4, batch 8) has only the misspelt key; the others each name their own values.
    assert any(
        "point 0 (train.learning_rate=0.0001, train.batch_size=8, train.lora_rnk=4)" in x and "lora_rnk" in x for x in lines
    ), text
    assert any("point 1 (" in x and "batch_size=0" in x and "train.batch_size" in x for x in lines), text
    assert any("point 2 (" in x and "learning_rate=-1" in x and "train.learning_rate" in x for x in lines), text
    assert all(x.startswith("sw.toml: point ") for x in lines), text


def test_settings_are_checked_before_any_point():
    with pytest.raises(SpecError) as info:
        expand(base(**{"train.learning_rate": 1e-4, "seed": [1, 2]}, max_parallel=0, mode="random"))
    text = str(info.value)
    for want in (
        "sweep.max_parallel",
        'sweep."train.learning_rate": needs a non-empty list',
        "sweep.seed: cannot be swept",
        'sweep.samples: mode = "random" needs samples',
    ):
        assert want in text, text


def test_the_example_sweep_is_valid_and_a_plain_jobspec_is_not_a_sweep():
    sw = load_sweep(REPO / "examples" / "sweep-lr-rank-gpu.toml")
    assert len(sw.members()) == 12 and sw.settings.max_usd == 6
    assert is_sweep_file(REPO / "examples" / "sweep-lr-rank-gpu.toml")
    assert not is_sweep_file(REPO / "jobspecs" / "quickstart.toml")


def test_a_registry_from_before_sweeps_gains_their_tables_and_keeps_its_runs(tmp_path):
    import sqlite3

    from autoslm.controller.registry import _MIGRATIONS, _SCHEMA, SCHEMA_VERSION, Registry
    from autoslm.controller.sweeps import Member, SweepBook, SweepRecord

    before = next(n for n, sql in _MIGRATIONS.items() if "TABLE IF NOT EXISTS sweeps" in sql)  # the version before sweeps
    db = sqlite3.connect(tmp_path / "registry.db")
    db.executescript(_SCHEMA + "".join(_MIGRATIONS[n] for n in range(1, before)))  # what that version wrote
    db.execute(f"PRAGMA user_version = {before}")
    db.execute("INSERT INTO runs VALUES ('old-1', 'old', 'sft', '{}', NULL, 'file:///x', 1, 2, 0)")
    db.execute("INSERT INTO replicas (run_id, seed, state, updated_at) VALUES ('old-1', 0, 'succeeded', 1)")
    db.commit()
    db.close()
    reg = Registry(tmp_path)
    assert reg.schema_version == SCHEMA_VERSION > before
    assert reg.replicas("old-1")[0].state == "succeeded"
    book = SweepBook(reg)
    assert book.find("s") == [] and book.sweep_of_run("old-1") is None
    book.create(
        SweepRecord("s-sweep-1", "s", None, '["train.lora_rank"]', 2, 5.0, 1.0),
        [Member("s-sweep-1", 0, 0, 0, '{"train.lora_rank": 8}', "{}", "file:///x", "s-p0-1", 0.5)],
    )
    (rec,) = SweepBook(Registry(tmp_path)).find("s-sw")
    assert rec.keys == ["train.lora_rank"] and rec.max_usd == 5.0
    assert book.sweep_of_run("s-p0-1") == "s-sweep-1" and book.members("s-sweep-1")[0].queued
