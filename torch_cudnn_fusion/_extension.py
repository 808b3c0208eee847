"""Loads the compiled core: the prebuilt torch_cudnn_fusion._C, or a just-in-time build on first GPU use."""

from __future__ import annotations

import os
import sys
import threading
from types import ModuleType

import torch

from . import _build_paths

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None


def _jit_build() -> ModuleType:
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        raise _build_paths.BuildSetupError(
            "the CUDA toolkit was not found (CUDA_HOME is unset and nvcc is not on PATH): install the toolkit "
            f"matching torch's CUDA {torch.version.cuda}, or install a build of torch_cudnn_fusion made with it"
        )
    sources = sorted(str(p) for p in _build_paths.csrc_dir().glob("*.c[pu]*"))
    includes = [str(_build_paths.frontend_include_dir()), str(_build_paths.cudnn_include_dir())]
    link = _build_paths.link_args()
    print(
        "torch_cudnn_fusion: loading the cuDNN extension from torch's extension cache, building it first if it is "
        "not there (about a minute)...",
        file=sys.stderr,
        flush=True,
    )
    return cpp_extension.load(
        name="torch_cudnn_fusion_C",
        sources=sources,
        extra_include_paths=includes,
        extra_cflags=_build_paths.COMPILE_ARGS,
        extra_cuda_cflags=["-O3"],
        extra_ldflags=link,
        with_cuda=True,
        is_python_module=True,
        verbose=False,
    )


DEBUG_DIR_VARIABLE = "TORCH_CUDNN_FUSION_DEBUG_DIR"


def _configure_debug_output() -> None:
    """With TORCH_CUDNN_FUSION_DEBUG_DIR set: cudnn-frontend's and cuDNN's own logs go to files there (set before
    anything of ours touches cuDNN; variables already set are left alone), and the extension writes each graph it
    builds there as JSON."""
    directory = os.environ.get(DEBUG_DIR_VARIABLE)
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    os.environ.setdefault("CUDNN_FRONTEND_LOG_INFO", "1")
    os.environ.setdefault("CUDNN_FRONTEND_LOG_FILE", os.path.join(directory, "cudnn_frontend.log"))
    os.environ.setdefault("CUDNN_LOGLEVEL_DBG", "3")
    os.environ.setdefault("CUDNN_LOGDEST_DBG", os.path.join(directory, "cudnn.log"))


def load() -> ModuleType | None:
    """The compiled module, loading or building it once; None (see `load_error()`) where it cannot be had."""
    global _module, _error
    if _module is not None or _error is not None:
        return _module
    with _lock:
        if _module is not None or _error is not None:
            return _module
        if torch.version.cuda is None or not torch.cuda.is_available():
            _error = "torch has no usable CUDA here, so the cuDNN extension is not loaded"
            return None
        _configure_debug_output()
        try:
            from . import _C as module  # built by `pip install` where torch had CUDA
        except ImportError:
            try:
                module = _jit_build()
            except Exception as exc:  # a failed build must not crash the model: layers run eager and say why
                _error = f"the cuDNN extension could not be built: {exc}"
                return None
        from . import ops

        ops.register_python_parts()
        _module = module
    from .plan_file import start_automatic_plan_cache

    start_automatic_plan_cache()  # TORCH_CUDNN_FUSION_PLAN_CACHE: load the plan file now, save it at exit
    return _module


def load_error() -> str | None:
    return _error


def require() -> ModuleType:
    """The compiled module, or a RuntimeError saying why it is unavailable."""
    module = load()
    if module is None:
        raise RuntimeError(f"torch_cudnn_fusion: {_error}")
    return module
