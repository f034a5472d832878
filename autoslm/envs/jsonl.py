"""``jsonl:path`` datasets: one JSON object a line, in any row format of ``autoslm.envs.rows``.

The last ``eval_fraction`` of the rows (or the file ``eval_path``) is the held-out split. At launch the
file is shipped into the run's store and the spec names the store's copy (``store:<sha256>/<name>``),
which ``files`` (``autoslm.store.shipping.DataFiles``) fetches on the worker; a plain path is read as
is (a worker started by hand, or an engine test). Every data problem is a FatalWorkerError naming the
file and line: a restart cannot fix it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from autoslm.envs.base import Example
from autoslm.envs.rows import PromptTemplate, RowError, RowsEnvironment, apply_template, rename, to_example
from autoslm.errors import FatalWorkerError


class JsonlParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eval_fraction: Annotated[float, Field(ge=0, lt=1, description="share of rows held out for eval (the last ones)")] = 0.1
    eval_path: Annotated[str | None, Field(description="a separate jsonl file for eval (overrides eval_fraction)")] = None
    max_rows: Annotated[int | None, Field(ge=1, description="use only the first N rows")] = None
    columns: Annotated[dict[str, str], Field(description='autoslm column -> your column, e.g. { prompt = "question" }')] = {}
    prompt_template: PromptTemplate = None


def first_example(path: str | Path, params: JsonlParams) -> Example:
    """The first training row of a local file, as the worker will see it (for ``validate``)."""
    return apply_template(read_rows(Path(path).expanduser(), 1, columns=params.columns)[0], params.prompt_template)


def read_rows(path: Path, limit: int | None = None, *, name: str | None = None, columns: dict | None = None) -> list[Example]:
    """Examples from a jsonl file; ``name`` is how errors call the file (default: its path)."""
    where = name or str(path)
    out: list[Example] = []
    try:
        f = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise FatalWorkerError(f"dataset file not found: {where}") from None
    except OSError as e:
        raise FatalWorkerError(f"cannot read the dataset file {where}: {e.strerror}") from None
    with f:
        lineno = 0
        try:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise FatalWorkerError(f"{where}:{lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise FatalWorkerError(f"{where}:{lineno}: each line must be a JSON object")
                try:
                    out.append(to_example(rename(row, columns)))
                except RowError as e:
                    raise FatalWorkerError(f"{where}:{lineno}: {e}") from None
                if limit and len(out) >= limit:
                    break
        except UnicodeDecodeError:
            raise FatalWorkerError(f"{where}:{lineno + 1}: not UTF-8 text") from None
    if not out:
        raise FatalWorkerError(f"{where}: no rows")
    return out


class JsonlEnv(RowsEnvironment):
    Params = JsonlParams

    def __init__(
        self,
        path: str | Path,
        params: dict,
        seed: int = 0,
        thinking: bool = False,
        files=None,
        *,
        answer_format: str | None = None,
        scored_by_rewards: bool = False,
    ):
        self.p = JsonlParams.model_validate(params)
        self.answer_format, self.scored_by_rewards = answer_format, scored_by_rewards
        local, shown = _local(str(path), files)
        self.path = local
        self.name = f"jsonl:{Path(shown).name}"
        rows = read_rows(local, self.p.max_rows, name=shown, columns=self.p.columns)
        if self.p.eval_path:
            eval_local, eval_shown = _local(self.p.eval_path, files)
            self._train, self._eval = rows, read_rows(eval_local, name=eval_shown, columns=self.p.columns)
        else:
            n_eval = int(len(rows) * self.p.eval_fraction)
            self._train, self._eval = rows[: len(rows) - n_eval], rows[len(rows) - n_eval :]
        self._train = [apply_template(ex, self.p.prompt_template) for ex in self._train]
        self._eval = [apply_template(ex, self.p.prompt_template) for ex in self._eval]


def _local(ref: str, files) -> tuple[Path, str]:
    """(local path, the name errors use) for a dataset reference."""
    if files is not None:
        return files.local_path(ref)
    from autoslm.layout import is_store_ref

    if is_store_ref(ref):
        raise FatalWorkerError(f"{ref} is a file in the run's store, and this worker was not given the store")
    return Path(ref).expanduser(), ref
