"""Shared pytest setup: CPU with 8 fake devices, quiet logs, offline hubs."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Eight fake CPU devices for the sharding tests; unsharded code uses one.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# The tests' models are tiny: XLA's compile time outweighs their run time,
# so tests (and the processes they start) compile with LLVM's optimization
# level 0. JAX_DISABLE_MOST_OPTIMIZATIONS=0 runs them fully optimized.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import atexit  # pylint: disable=g-import-not-at-top,wrong-import-position
import shutil  # pylint: disable=g-import-not-at-top,wrong-import-position
import tempfile  # pylint: disable=g-import-not-at-top,wrong-import-position

# Many tests compile the same programs (the same tiny policy at the same
# shapes) under new jit closures, in this process, in pytest-xdist's workers
# and in the processes tests start: one compilation cache for the session
# compiles each once. The process that makes it (pytest's main one) removes it
# at exit; the others inherit it through the environment. A size cap turns on
# the cache's file lock, which keeps the processes' reads and writes apart.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _COMPILE_CACHE = tempfile.mkdtemp(prefix="seed_jax_test_xla_")
  atexit.register(shutil.rmtree, _COMPILE_CACHE, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _COMPILE_CACHE
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope="session")
def smollm2():
  """(config, params, tokenizer) of SmolLM2-135M-Instruct from its GGUF."""
  from seed_jax import hf
  config, params = hf.load_gguf()
  return config, params, hf.load_tokenizer()


@pytest.fixture(scope="session")
def smollm2_torch():
  """The transformers (PyTorch) SmolLM2 model, loaded from the same GGUF."""
  import torch
  import transformers
  from seed_jax import hf
  path = hf.smollm2_gguf_path()
  return transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path),
      dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
  """A tiny SEED run of 2 updates (checkpoints 1 and 2, evaluated at 0 and 2,
  no policy folder), shared read-only: copy it before changing it."""
  import gin
  from seed_jax import train
  tiny = os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), "configs/experiments/tiny.gin")
  workdir = str(tmp_path_factory.mktemp("tiny_run") / "run")
  gin.clear_config()
  train.main(["--gin_file", tiny, f"--gin.WORKDIR='{workdir}'"])
  gin.clear_config()
  return workdir


@pytest.fixture
def savefig_fails_midway(monkeypatch):
  """`install(head)`: from then on, matplotlib's Figure.savefig writes `head`
  (part of a PNG) and fails as a full disk does."""
  import contextlib  # pylint: disable=g-import-not-at-top
  from matplotlib import figure  # pylint: disable=g-import-not-at-top

  def install(head: bytes) -> None:
    def crash(self, fname, **kwargs):
      del self, kwargs
      with (open(fname, "wb") if isinstance(fname, str) else
            contextlib.nullcontext(fname)) as f:
        f.write(head)
      raise OSError(28, "No space left on device")
    monkeypatch.setattr(figure.Figure, "savefig", crash)

  return install
