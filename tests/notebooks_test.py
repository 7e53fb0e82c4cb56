"""Runs every colab/*.ipynb top to bottom under the small setting.

SEED_NOTEBOOK_SMALL=1 makes each notebook train a random tiny policy for an
update or two, so the three together take a few minutes on a CPU. Runs write
under a temporary working directory, in folders of SMALL's own
(runs/*_small); notebooks are stored without outputs. The full setting is
checked where it must not train or write: skills.ipynb without the
quickstart's policy, sweeps.ipynb pointed at a sweep trained elsewhere.
"""

import ast
import json
import pathlib
import re

import pytest

nbformat = pytest.importorskip(
    "nbformat", reason="notebook tests need nbformat (requirements-test.txt)")
nbclient = pytest.importorskip(
    "nbclient", reason="notebook tests need nbclient (requirements-test.txt)")
pytest.importorskip(
    "ipykernel", reason="notebook tests need ipykernel for the python3 kernel")

REPO = pathlib.Path(__file__).resolve().parent.parent
COLAB = REPO / "colab"
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
  # SMALL keeps to folders of its own: a full run resuming a SMALL run's
  # checkpoint, or reading its runs, would get a random tiny model.
  runs = tmp_path / "runs"
  written = sorted(d.name for d in runs.iterdir()) if runs.exists() else []
  assert all(name.endswith("_small") for name in written), written
  _check_sweep_folders(runs)


def _check_sweep_folders(runs):
  """Run i of a sweep trained in `<root>/<sweep>/i` has run i's bindings."""
  from seed_jax import sweep  # pylint: disable=g-import-not-at-top
  for path in sorted(REPO.glob("configs/sweeps/*.py")):
    bindings = sweep.load(str(path))
    for config in runs.glob(f"*/{path.stem}/*/config.gin"):
      i = int(config.parent.name)
      lines = set(config.read_text().splitlines())
      for k, v in bindings[i].items():
        assert f"{k} = {v!r}" in lines, (config, k, v)


def _execute(nb, path, timeout=CELL_TIMEOUT_S):
  nbclient.NotebookClient(
      nb, timeout=timeout, kernel_name="python3",
      resources={"metadata": {"path": str(path)}}).execute()


def _files(folder):
  return {str(p.relative_to(folder)): p.stat().st_mtime_ns
          for p in folder.rglob("*")}


def test_skills_needs_the_quickstart_policy(tmp_path, monkeypatch):
  """Without the quickstart's saved policy the full setting stops at once,
  and creates nothing a later quickstart run would reload."""
  monkeypatch.setenv("SEED_NOTEBOOK_SMALL", "0")
  nb = nbformat.read(COLAB / "skills.ipynb", as_version=4)
  with pytest.raises(Exception) as e:  # CellExecutionError, or a timeout
    _execute(nb, tmp_path, timeout=120)
  assert "run quickstart.ipynb" in str(e.value)
  assert not (tmp_path / "runs").exists()


def test_sweeps_small_trains_two_distillation_weights():
  """SMALL picks its runs by index: the sweep's λ = 0 run and the next λ."""
  from seed_jax import sweep  # pylint: disable=g-import-not-at-top
  nb = nbformat.read(COLAB / "sweeps.ipynb", as_version=4)
  code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
  selected, = re.findall(r"selected, extra = (\[[\d, ]*\]), ", code)
  runs = sweep.load(str(REPO / "configs/sweeps/opd_lambda_beta.py"))
  coef, beta = "trainer.RLConfig.opd_coef", "trainer.RLConfig.opd_beta"
  assert [runs[i] for i in ast.literal_eval(selected)] == [
      {coef: 0.0}, {coef: 0.003, beta: 1.0}]


def test_sweeps_only_reads_a_sweep_trained_elsewhere(tmp_path, monkeypatch):
  monkeypatch.setenv("SEED_NOTEBOOK_SMALL", "1")
  elsewhere = tmp_path / "elsewhere"
  for i in (0, 3):  # two runs done, the others never started
    run = elsewhere / "opd_lambda_beta" / str(i)
    run.mkdir(parents=True)
    record = {"update": 3, "success_rate": 0.5, "eval/seen/success": 0.25,
              "eval/unseen/success": 0.1 * i, "kl": 0.01}
    (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
  before = _files(elsewhere)
  nb = nbformat.read(COLAB / "sweeps.ipynb", as_version=4)
  at = next(i for i, c in enumerate(nb.cells)
            if "parameters" in c.metadata.get("tags", []))
  nb.cells.insert(at + 1, nbformat.v4.new_code_cell(
      f"ROOT = {str(elsewhere)!r}"))  # as papermill injects parameters
  _execute(nb, tmp_path)
  assert _files(elsewhere) == before  # nothing trained or written there
  assert not (tmp_path / "runs").exists()
