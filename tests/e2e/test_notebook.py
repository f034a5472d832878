"""examples/quickstart.ipynb runs end to end in a real Jupyter kernel (nbclient): launch, progress bar,
metrics frame, plot, runs frame, attach, download, report and chat, on the built-in tiny model."""

from __future__ import annotations

import base64
import os
import shutil

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e
nbclient = pytest.importorskip("nbclient", reason="the notebook extra is not installed (make setup installs it)")
nbformat = pytest.importorskip("nbformat")


def test_quickstart_notebook_runs_end_to_end(home, tmp_path, monkeypatch):
    nb_path = tmp_path / "quickstart.ipynb"
    shutil.copy(REPO / "examples" / "quickstart.ipynb", nb_path)
    nb = nbformat.read(nb_path, as_version=4)
    # The kernel (and the workers it starts) import this checkout, whatever the environment's install points at.
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell's traceback, if any cell fails

    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    texts = "\n".join(o.get("text", "") + str((o.get("data") or {}).get("text/plain", "")) for o in outs)
    assert "'succeeded'" in texts, texts
    assert "True done" in texts  # attach by a prefix found the same run
    # The plot cell displayed a PNG figure, and the frames rendered as tables.
    pngs = [o["data"]["image/png"] for o in outs if "image/png" in (o.get("data") or {})]
    assert pngs and base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n"
    html = "".join(str((o.get("data") or {}).get("text/html", "")) for o in outs)
    assert "eval_loss" in html and "tokens_per_s" in html and "nb-quickstart-" in html
    assert (tmp_path / "nb-adapter" / "adapter_config.json").exists()
    assert "<svg" in (tmp_path / "nb-report.html").read_text()
    # run.chat answered with text (the fine-tuned model's: 60 steps do not make it reliable at sums).
    chat = next(c for c in nb.cells if c.cell_type == "code" and "run.chat(" in c.source)
    answer = "".join(str((o.get("data") or {}).get("text/plain", "")) for o in chat.outputs)
    assert answer.startswith("'") and len(answer) > 2, chat.outputs
