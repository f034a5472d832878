"""Where secrets come from, and how they are kept out of everything we write or print.

Secrets live in environment variables (or, for provider keys, a 0600 credentials file), never in a
JobSpec. ``redact`` is applied to every log line, event, error text and artifact the project writes.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from pathlib import Path

from autoslm.vendors.table import account_key_envs, pod_secret_envs

# Environment variables whose values are secrets. Values of these are scrubbed from anything we write.
# Every vendor's account key and the keys it puts into its own pods come from the vendor table (vendors/table.py).
SECRET_ENV_VARS = tuple(
    dict.fromkeys(
        (
            "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN",
            *dict.fromkeys(account_key_envs() + pod_secret_envs()),
            "OPENAI_API_KEY",
            "AUTOSLM_JUDGE_API_KEY",
            # experiment trackers (autoslm.controller.tracker_env)
            "WANDB_API_KEY",
            "MLFLOW_TRACKING_TOKEN",
            "MLFLOW_TRACKING_PASSWORD",
        )
    )
)

# Key names that look like secrets: rejected in a JobSpec (a name ending in "_env" names a variable instead).
# "hf_token", "api_key", "password", "client_secret" match; "max_completion_tokens" does not.
SECRET_KEY_PATTERN = r"(^|[_-])(token|api[_-]?key|apikey|password|passwd|secret|credentials?)$"

_TOKEN_PATTERNS = (
    r"hf_[A-Za-z0-9]{16,}",
    r"(?i)(bearer\s+)[A-Za-z0-9._\-]{8,}",
    r"rpa_[A-Za-z0-9]{16,}",
    r"sk-[A-Za-z0-9_\-]{16,}",
)


def looks_secret(key: str) -> bool:
    """Whether a JobSpec key's name looks like a secret's (SECRET_KEY_PATTERN)."""
    return _compiled(SECRET_KEY_PATTERN, re.I).search(key) is not None


@functools.lru_cache(maxsize=None)
def _compiled(pattern: str, flags: int = 0) -> re.Pattern:
    """Compiled at first use: `status` and `--help` never redact, and compiling costs their start."""
    return re.compile(pattern, flags)


REDACTED = "***"


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    names = set(SECRET_ENV_VARS) | {k for k in env if k.startswith("AUTOSLM_SECRET_")}
    return sorted({env[n] for n in names if env.get(n) and len(env[n]) >= 6}, key=len, reverse=True)


def redact(text: str, environ: dict[str, str] | None = None) -> str:
    """Replace every known secret value and every token-shaped string in ``text``."""
    for value in secret_values(environ):
        text = text.replace(value, REDACTED)
    for pattern in _TOKEN_PATTERNS:
        text = _compiled(pattern).sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
    return text


def credentials_path() -> Path:
    return autoslm_home() / "credentials.toml"


def autoslm_home() -> Path:
    return Path(os.environ.get("AUTOSLM_HOME") or Path.home() / ".autoslm").expanduser()


def provider_key(env_var: str, section: str) -> str | None:
    """A provider key from its environment variable, else from ``$AUTOSLM_HOME/credentials.toml``.

    The file is read only when it is private to its owner (mode 0600 or stricter): a key in a
    world-readable file is refused rather than silently used.
    """
    value = os.environ.get(env_var)
    if value:
        return value
    path = credentials_path()
    if not path.exists():
        return None
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        from autoslm.errors import ProviderAuthError

        raise ProviderAuthError(
            f"{path} is readable by others (mode {oct(mode)})",
            hint=f"run: chmod 600 {path}",
        )
    import tomllib

    data = tomllib.loads(path.read_text())
    value = (data.get(section) or {}).get("api_key")
    return value or None
