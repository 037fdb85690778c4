"""What the GPU machine's image holds, and which distributions a process imported that it lacks
(used by benchmarks/gpu_check.py: each phase reports them, the summary lists them)."""

from __future__ import annotations

import re
import sys

# the machine's image as read there on 2026-11-17 (pip list of its python3), and what is carried
_IMAGE_NAMES = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
attrs botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax
e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp"""
IMAGE = set(_IMAGE_NAMES.split())
CARRIED = {"megatron-core", "omegaconf", "hydra-core", "antlr4-python3-runtime"}
# launcher plugins Hydra imports while it scans, whichever are installed (dev has all three)
HYDRA_PLUGINS = {"hydra-joblib-launcher", "hydra-submitit-launcher", "hydra-ray-launcher"}


def norm_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def loaded_distributions() -> list[str]:
    """The distributions this process imported modules from (the repo itself is none)."""
    import importlib.metadata as md

    owners = md.packages_distributions()
    found: set[str] = set()
    for name, module in list(sys.modules.items()):
        candidates = owners.get(name.partition(".")[0], [])
        if len(candidates) == 1:
            found.add(candidates[0])
            continue
        path = getattr(module, "__file__", None)
        for dist in candidates if path else []:  # a namespace shared by several: by file
            files = md.distribution(dist).files or []
            if any(str(f.locate()) == path for f in files):
                found.add(dist)
    return sorted({norm_name(d) for d in found} - {"rlbench"})


def not_on_image(loaded: list[str]) -> list[str]:
    """Loaded distributions the machine would lack: neither on its image, nor carried, nor
    required (transitively, extras included) by one that is -- a requirement of an image
    package is the image's business (this machine's huggingface-hub may need other packages
    than the image's does). Hydra imports every launcher plugin that is installed while it
    scans for plugins; absent, it finds none, so those do not count."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    def requires(dist: str) -> set[str]:
        try:
            return {norm_name(Requirement(r).name) for r in md.requires(dist) or []}
        except md.PackageNotFoundError:
            return set()

    present = set(loaded)
    ok = present & (IMAGE | CARRIED | HYDRA_PLUGINS)
    frontier = set(ok)
    while frontier:
        frontier = {d for owner in frontier for d in requires(owner) & present} - ok
        ok |= frontier
    return sorted(present - ok)
