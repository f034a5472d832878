"""``hf:owner/name``: a dataset on the Hugging Face Hub, loaded on the worker with ``datasets``.

Rows may be in any format of ``autoslm.envs.rows`` (chat ``messages``, ``prompt``/``completion``,
``prompt``/``answer``, optional ``tools``); ``params.columns`` maps the dataset's own column names.
The held-out rows are ``eval_split``, or else the last ``eval_fraction`` of ``split``. Private and
gated datasets are read with ``HF_TOKEN`` (the library reads it from the environment).

Data problems (no such dataset, config or split, a missing column, an empty split, a row that cannot
be used) raise FatalWorkerError: a restart cannot fix them. Network trouble is left to propagate as it
is, so the attempt counts as retryable. ``autoslm.store.hub_check`` runs the same column rules on the
laptop before anything is rented.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoslm.envs.base import Example
from autoslm.envs.rows import PromptTemplate, RowError, RowsEnvironment, apply_template, missing_columns, rename, to_example
from autoslm.errors import FatalWorkerError

PREFIX = "hf:"
DATASET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class HubDatasetParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: Annotated[str | None, Field(description="the dataset's configuration (subset) name")] = None
    split: Annotated[str, Field(min_length=1, description="the split to train on")] = "train"
    eval_split: Annotated[str | None, Field(description='a split held out for eval, e.g. "test" (overrides eval_fraction)')] = (
        None
    )
    eval_fraction: Annotated[
        float,
        Field(ge=0, lt=1, description="share of the train split held out for eval (the last rows), when there is no eval_split"),
    ] = 0.1
    revision: Annotated[str | None, Field(description="a branch, tag or commit of the dataset repo (default: main)")] = None
    max_rows: Annotated[int | None, Field(ge=1, description="use only the first N rows of the split")] = None
    columns: Annotated[
        dict[str, str],
        Field(description='autoslm column -> the dataset\'s column, e.g. { prompt = "question", answer = "solution" }'),
    ] = {}
    prompt_template: PromptTemplate = None

    @model_validator(mode="after")
    def _distinct(self):
        if self.eval_split is not None and self.eval_split == self.split:
            raise ValueError(f"eval_split must differ from split ({self.split!r}): eval rows must be held out")
        return self


def dataset_id_problem(env_id: str) -> str | None:
    """None when ``env_id`` has the shape ``hf:owner/name``; otherwise what is wrong (offline)."""
    name = env_id[len(PREFIX) :]
    if not DATASET_ID.match(name):
        return f'a Hub dataset id looks like "hf:owner/name", got {env_id!r}'
    return None


class HubDatasetEnv(RowsEnvironment):
    Params = HubDatasetParams

    def __init__(
        self,
        env_id: str,
        params: dict,
        seed: int = 0,
        thinking: bool = False,
        *,
        cache_dir: Path | None = None,
        loader=None,
        judged: bool = False,
        answer_format: str | None = None,
        scored_by_rewards: bool = False,
    ):
        problem = dataset_id_problem(env_id)
        if problem:
            raise FatalWorkerError(problem)
        self.name = env_id
        self.repo = env_id[len(PREFIX) :]
        self.p = HubDatasetParams.model_validate(params)
        self.cache_dir = cache_dir
        self.judged = judged or scored_by_rewards  # a judge or the reward functions score: rows need no answer
        self.answer_format, self.scored_by_rewards = answer_format, scored_by_rewards
        self._loader = loader or self._load
        train = self._examples(self.p.split, self.p.max_rows)
        if self.p.eval_split:
            self._train, self._eval = train, self._examples(self.p.eval_split, None)
        else:
            n_eval = int(len(train) * self.p.eval_fraction)
            self._train, self._eval = train[: len(train) - n_eval], train[len(train) - n_eval :]

    def _load(self, split: str):
        import datasets
        from datasets.exceptions import DatasetNotFoundError

        kwargs: dict[str, Any] = {"split": split, "revision": self.p.revision}
        if self.cache_dir is not None:
            kwargs["cache_dir"] = str(self.cache_dir)
        where = f"{self.name}" + (f" (config {self.p.config!r})" if self.p.config else "")
        try:
            return datasets.load_dataset(self.repo, self.p.config, **kwargs)
        except DatasetNotFoundError:
            raise FatalWorkerError(
                f"{where}: no such dataset on the Hub, or it is private or gated and HF_TOKEN cannot read it",
                hint="check the id; for a private or gated dataset set HF_TOKEN to a token that can read it",
            ) from None
        except (ValueError, FileNotFoundError) as e:  # unknown split or config, no data files
            if "corresponds to no data" in str(e):
                raise FatalWorkerError(f"{where} split {split!r} has no rows") from None
            raise FatalWorkerError(f"{where}: {_one_line(e)}") from None
        except Exception as e:
            # Matched by name: these classes live in different modules across datasets releases.
            if type(e).__name__ in ("DatasetGenerationError", "GatedRepoError", "EmptyDatasetError", "DataFilesNotFoundError"):
                cause = e.__cause__ or e.__context__ or e
                raise FatalWorkerError(f"{where}: the {split!r} split cannot be read: {_one_line(cause)}") from None
            raise

    def _examples(self, split: str, limit: int | None) -> list[Example]:
        ds = self._loader(split)
        where = f"{self.name} split {split!r}"
        if len(ds) == 0:
            raise FatalWorkerError(f"{where} has no rows")
        if limit is not None and len(ds) > limit:
            ds = ds.select(range(limit))
        columns = set(rename(dict.fromkeys(ds.column_names), self.p.columns))
        problem = missing_columns(columns, self.judged)
        if problem:
            raise FatalWorkerError(f"{where}: {problem}")
        out = []
        for i, row in enumerate(ds):
            try:
                out.append(apply_template(to_example(rename(row, self.p.columns)), self.p.prompt_template))
            except RowError as e:
                raise FatalWorkerError(f"{where} row {i} (counting from 0): {e}") from None
        return out


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:400] or type(e).__name__
