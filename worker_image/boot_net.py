"""What boot says to the world, with urllib alone (it runs before autoslm is importable): the run's
store -- autoslm's wheel fetched and checked against its sha256, an error record committed -- and the
vendor's API, through which a pod ends itself with the key the vendor injects for it. Standard
library only, syntax a python 3.8 can read, like boot.py. A token goes only to the host it is for,
never onto a command line. ``log`` is the one way every boot file prints.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request

from boot_rules import end_request, error_path, pod_vendor


def log(msg):
    print("[autoslm] %s" % msg, flush=True)


def write_error(env, text):
    """The error record (``boot_rules.error_path``) into the run's store: a commit to a Hub dataset repo,
    or a file in a local folder. Raises when it could not."""
    store, path = env.get("AUTOSLM_STORE", ""), error_path(env)
    if not (store and env.get("AUTOSLM_RUN_ID")):
        raise ValueError("no AUTOSLM_STORE/AUTOSLM_RUN_ID")
    if store.startswith("hf://"):
        endpoint = (env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        lines = [
            {"key": "header", "value": {"summary": "error", "description": ""}},
            {"key": "file", "value": {"path": path, "encoding": "base64", "content": base64.b64encode(text.encode()).decode()}},
        ]
        call(
            "POST",
            "%s/api/datasets/%s/commit/main" % (endpoint, store[len("hf://") :].strip("/")),
            env.get("HF_TOKEN"),
            "\n".join(json.dumps(x) for x in lines).encode(),
            "application/x-ndjson",
        )
    else:
        dest = os.path.join(local_root(store), path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest + ".part", "w") as f:
            f.write(text)
        os.replace(dest + ".part", dest)


class FetchError(Exception):
    pass


def fetch_wheel(ref, dest_dir, env):
    """The wheel from the run's store, checked against its sha256; returns its local path."""
    m = re.match(r"^store:([0-9a-f]{64})/([A-Za-z0-9_.+-]+\.whl)$", ref)
    if not m:
        raise FetchError("not a wheel in the store (want store:<sha256>/<file>.whl): %s" % ref)
    sha, name = m.groups()
    blob = "data/sha256/%s" % sha
    store = env.get("AUTOSLM_STORE", "")
    dest = os.path.join(dest_dir, name)
    part = dest + ".part"
    if store.startswith("hf://"):
        endpoint = (env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        url = "%s/datasets/%s/resolve/main/%s" % (endpoint, store[len("hf://") :].strip("/"), blob)
        download(url, part, env.get("HF_TOKEN"))
    elif store:
        root = local_root(store)
        try:
            shutil.copyfile(os.path.join(root, blob), part)
        except OSError as e:
            raise FetchError("could not read %s from %s: %s" % (blob, root, e.strerror)) from None
    else:
        raise FetchError("AUTOSLM_STORE is not set: the pod cannot tell where the wheel is")
    h = hashlib.sha256()
    with open(part, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != sha:
        raise FetchError("%s from the store does not match its sha256" % name)
    os.replace(part, dest)
    return dest


class SameHostAuth(urllib.request.HTTPRedirectHandler):
    """The token goes to the Hub only, not to wherever it redirects a large file."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def download(url, dest, token, attempts=5):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    opener = urllib.request.build_opener(SameHostAuth)
    for attempt in range(attempts):
        try:
            with opener.open(req, timeout=60) as r, open(dest, "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
            return
        except urllib.error.HTTPError as e:
            if e.code < 500 and e.code != 429:
                raise FetchError("the store answered %d for %s" % (e.code, url)) from None
            why = "HTTP %d" % e.code
        except OSError as e:
            why = type(e).__name__
        if attempt == attempts - 1:
            raise FetchError("could not download %s (%s)" % (url, why))
        time.sleep(2**attempt)


def local_root(store):
    return urllib.parse.unquote(urllib.parse.urlsplit(store).path) if store.startswith("file://") else store


def call(method, url, key, body=None, ctype=None):
    req = urllib.request.Request(url, data=body, method=method)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    if ctype:
        req.add_header("Content-Type", ctype)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


def in_pod(env):
    return pod_vendor(env) is not None


def request_pod_end(env):
    """End this pod with the key the vendor injects for it (boot_rules.POD_VENDORS; the worker's
    autoslm/engine/pod/selfterm.py adds each vendor's fallbacks). True when it was asked to go and said yes."""
    pod = pod_vendor(env)
    if pod is None or not pod["key"]:
        return False
    try:
        method, url = end_request(pod)
        call(method, url, pod["key"])
        log("ended %s %s %s" % (pod["title"], pod["noun"], pod["id"]))
        return True
    except Exception as e:  # noqa: BLE001
        log("could not end its own pod (%s); the controller ends it" % type(e).__name__)
    return False
