#!/usr/bin/env bash
# Show that worker_image/requirements-gpu.txt and autoslm[worker,gpu] resolve together, as the image installs them:
#   worker_image/check-pins.sh            # PYTHON=python3.11 worker_image/check-pins.sh to pick the interpreter
#
# A pip resolver dry run (--dry-run --ignore-installed) in a throwaway venv with every pip config file
# and PIP_* setting ignored, so a machine-wide constraint (a torch cap in /etc/xdg/pip, say) cannot make
# it lie. Run it on Linux x86_64 with Python 3.11, like the image. It downloads wheel metadata, and whole
# wheels where an index serves no separate metadata (several GB of CUDA libraries on a cold pip cache).
# It installs nothing outside a temporary directory; exit status 0 means the set resolves.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
python=${PYTHON:-python3}

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "warning: the image is Linux x86_64; resolving on $(uname -s)-$(uname -m) can pick other wheels" >&2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv "$tmp/venv"

# --isolated ignores pip.conf files and PIP_* variables; the explicit empty values are belt and braces.
pip() { env PIP_CONSTRAINT= PIP_CONFIG_FILE=/dev/null PIP_REQUIRE_VIRTUALENV= "$tmp/venv/bin/python" -m pip --isolated "$@"; }

pip install --quiet --upgrade pip
echo "resolving with $("$tmp/venv/bin/python" -c 'import sys; print(sys.version.split()[0])') on $(uname -s)-$(uname -m)"
pip install --dry-run --ignore-installed --quiet --report "$tmp/report.json" \
  -r "$here/requirements-gpu.txt" -c "$here/requirements-gpu.txt" "$root[worker,gpu]"

"$tmp/venv/bin/python" - "$tmp/report.json" "$here/requirements-gpu.txt" <<'PY'
import json, re, sys

report = json.load(open(sys.argv[1]))
got = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]}
pins = {}
for line in open(sys.argv[2]):
    m = re.match(r"^\s*([A-Za-z0-9_.-]+)==([^\s#]+)", line)
    if m:
        pins[m.group(1).lower().replace("_", "-")] = m.group(2)
bad = {name: (want, got.get(name)) for name, want in pins.items() if got.get(name) != want}
print(f"resolved {len(got)} distributions; pinned:")
for name in sorted(pins):
    print(f"  {name}=={got.get(name)}")
nvidia = sorted(n for n in got if n.startswith(("nvidia-", "cuda-")))
print(f"CUDA wheels: {', '.join(f'{n}=={got[n]}' for n in nvidia if n.startswith('cuda-toolkit')) or 'none'} (+{len(nvidia)} nvidia/cuda packages)")
if bad:
    print("pins not honoured:", bad, file=sys.stderr)
    sys.exit(1)
print("ok: the pins resolve together")
PY
