"""Runs every colab/*.ipynb top to bottom under the small setting.

SEED_NOTEBOOK_SMALL=1 makes each notebook train a random tiny policy for an
update or two, so the three together take a few minutes on a CPU. Runs write
under a temporary working directory; notebooks are stored without outputs.
"""

import pathlib

import pytest

nbformat = pytest.importorskip(
    "nbformat", reason="notebook tests need nbformat (requirements-test.txt)")
nbclient = pytest.importorskip(
    "nbclient", reason="notebook tests need nbclient (requirements-test.txt)")
pytest.importorskip(
    "ipykernel", reason="notebook tests need ipykernel for the python3 kernel")

COLAB = pathlib.Path(__file__).resolve().parent.parent / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def test_notebooks_found():
  assert {p.stem for p in NOTEBOOKS} >= {"quickstart", "skills", "sweeps"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert "import seed_jax" in code[0].source  # the install cell comes first
  for cell in code:
    assert not cell.outputs and cell.execution_count is None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path, tmp_path, monkeypatch):
  monkeypatch.setenv("SEED_NOTEBOOK_SMALL", "1")  # the kernel inherits it
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(
      nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
      resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError on the first failing cell
  errors = [o for c in nb.cells if c.cell_type == "code"
            for o in c.outputs if o.output_type == "error"]
  assert not errors
