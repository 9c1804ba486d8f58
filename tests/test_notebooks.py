"""The notebooks run top to bottom on the tiny preset (KFORMER_NOTEBOOK_CONFIG=tiny), in order:
1 trains the model that 2 looks inside and 3 exports. Any failing cell fails the test."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
ORDER = ["01_train.ipynb", "02_inside_the_transformer.ipynb", "03_export_and_run.ipynb"]


@pytest.mark.slow
def test_notebooks_run_in_order(tmp_path, monkeypatch):
    assert sorted(os.listdir(NOTEBOOKS)) == sorted(ORDER)
    monkeypatch.setenv("KFORMER_NOTEBOOK_CONFIG", "tiny")
    monkeypatch.setenv("KFORMER_NOTEBOOK_DIR", str(tmp_path))
    for name in ORDER:
        notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
        assert not any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), (
            f"{name} is committed with outputs; strip them"
        )
        NotebookClient(
            notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}
        ).execute()
        images = [
            o for cell in notebook.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})
        ]
        assert images, f"{name} showed no picture"
        if name == "01_train.ipynb":
            text = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
            assert "BLEU =" in text and "nrefs:" in text
    assert os.path.exists(os.path.join(tmp_path, "export-tiny", "manifest.json"))
