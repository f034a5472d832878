"""A sweep: one JobSpec with a ``[sweep]`` table, expanded into the JobSpecs of its points. Pure.

    [sweep]
    "train.learning_rate" = [1e-4, 3e-4]   # dotted JobSpec keys, each with a list of values
    "train.lora_rank" = [16, 64]
    mode = "grid"                          # or "random": `samples` points drawn with `sampling_seed`
    max_parallel = 2                       # runs (pods) at once
    max_usd = 20                           # the whole sweep's cap

The grid is the product of the lists; the top-level ``seed`` list replicates every point, and each
(point, seed) is a run of its own. Every point is validated as a full JobSpec, and every problem of
every point is reported at once, each naming its point. Nothing here touches the network.
"""

from __future__ import annotations

import copy
import itertools
import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autoslm.errors import SpecError, SpecIssue
from autoslm.spec import JobSpec, validate_dict

SETTINGS = ("mode", "samples", "sampling_seed", "max_parallel", "max_usd")
_NAME_ROOM = 43  # a point's run is named "<name>-p<N>" and a name has at most 48 characters


class SweepSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["grid", "random"] = "grid"
    samples: int | None = Field(default=None, ge=1, le=1000)
    sampling_seed: int = 0
    max_parallel: int = Field(default=1, ge=1, le=64)
    max_usd: float | None = Field(default=None, gt=0)


@dataclass(frozen=True)
class Point:
    index: int
    values: dict[str, Any]  # swept key -> this point's value
    spec: JobSpec  # the full JobSpec of the point, every seed of the base file

    @property
    def label(self) -> str:
        return " ".join(f"{short_key(k)}={fmt_value(v)}" for k, v in self.values.items())


@dataclass(frozen=True)
class Sweep:
    name: str
    keys: list[str]
    settings: SweepSettings
    points: list[Point] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return self.points[0].spec.seeds if self.points else []

    def members(self) -> list[tuple[Point, int, JobSpec]]:
        """(point, seed, the run's JobSpec with that one seed), points first."""
        return [(p, s, p.spec.model_copy(update={"seed": s})) for p in self.points for s in p.spec.seeds]


def short_key(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def fmt_value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def is_sweep_file(path: str | Path) -> bool:
    """A TOML file with a [sweep] table (an unreadable file is not: load_spec then says why)."""
    try:
        return isinstance(tomllib.loads(Path(path).read_text(encoding="utf-8")).get("sweep"), dict)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def load_any(path: str | Path) -> JobSpec | Sweep:
    """A JobSpec file, read and parsed once: its ``Sweep`` when it has a [sweep] table, else its JobSpec
    (what `validate`, `plan`, `launch` and ``autoslm.launch`` each start from)."""
    path = Path(path)
    fname = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError([SpecIssue(fname, "", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError([SpecIssue(fname, "", f"cannot read: {e}")]) from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError([SpecIssue(fname, "", f"invalid TOML: {e}")]) from None
    if isinstance(raw.get("sweep"), dict):
        return expand(raw, fname, base_dir=path.parent)
    return validate_dict(raw, fname, path.parent)


def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SpecError([SpecIssue(str(path), "", f"cannot read: {e}")]) from None
    return expand(raw, str(path), base_dir=path.parent)


def expand(raw: dict, fname: str = "<sweep>", base_dir: Path | None = None) -> Sweep:
    """The points of a sweep file's dict, each validated as a full JobSpec; all problems at once."""
    table = raw.get("sweep")
    if not isinstance(table, dict):
        raise SpecError([SpecIssue(fname, "sweep", "a sweep needs a [sweep] table of dotted keys with lists of values")])
    base = {k: v for k, v in raw.items() if k != "sweep"}
    issues: list[SpecIssue] = []
    try:
        settings = SweepSettings.model_validate({k: v for k, v in table.items() if k in SETTINGS})
    except ValidationError as e:
        settings = SweepSettings()
        issues += [SpecIssue(fname, "sweep." + ".".join(map(str, err["loc"])), err["msg"]) for err in e.errors()]
    grid = {k: v for k, v in table.items() if k not in SETTINGS}
    for key, values in grid.items():
        if key in ("seed", "name"):
            issues.append(
                SpecIssue(
                    fname,
                    f"sweep.{key}",
                    "cannot be swept: list seeds in the top-level `seed` "
                    "(each point runs every seed), and the sweep keeps one name",
                )
            )
        elif not isinstance(values, list) or not values:
            issues.append(SpecIssue(fname, f'sweep."{key}"', f"needs a non-empty list of values, got {values!r}"))
    if not grid:
        issues.append(SpecIssue(fname, "sweep", 'lists no key to sweep: add e.g. "train.learning_rate" = [1e-4, 3e-4]'))
    mode, samples = table.get("mode", "grid"), table.get("samples")  # as written: a bad setting elsewhere hides nothing
    if mode == "random" and samples is None:
        issues.append(SpecIssue(fname, "sweep.samples", 'mode = "random" needs samples = N (how many points to draw)'))
    if mode == "grid" and samples is not None:
        issues.append(SpecIssue(fname, "sweep.samples", 'is for mode = "random"; a grid runs every point'))
    if issues:
        raise SpecError(issues)
    keys = list(grid)
    combos = [dict(zip(keys, c)) for c in itertools.product(*(grid[k] for k in keys))]
    if settings.mode == "random":
        if settings.samples > len(combos):
            raise SpecError(
                [
                    SpecIssue(
                        fname,
                        "sweep.samples",
                        f'{settings.samples} is more than the {len(combos)} points of the grid: lower it, or use mode = "grid"',
                    )
                ]
            )
        combos = random.Random(settings.sampling_seed).sample(combos, settings.samples)
    name = str(base.get("name", "sweep"))[:_NAME_ROOM].rstrip("-")
    points = []
    for i, values in enumerate(combos):
        label = f"point {i} (" + ", ".join(f"{k}={fmt_value(v)}" for k, v in values.items()) + ")"
        doc = _override(base, values, name=f"{name}-p{i}")
        try:
            points.append(Point(i, values, validate_dict(doc, fname, base_dir)))
        except SpecError as e:
            issues += [SpecIssue(f"{fname}: {label}", x.field, x.message) for x in e.issues]
    if issues:
        raise SpecError(issues)
    return Sweep(name=name, keys=keys, settings=settings, points=points)


def _override(base: dict, values: dict[str, Any], name: str) -> dict:
    doc = copy.deepcopy(base)
    doc["name"] = name
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = doc
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}  # a missing table: validation then names what is wrong in it
            node = node[p]
        node[leaf] = value
    return doc
