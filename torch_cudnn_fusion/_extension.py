"""Loads the compiled core: the prebuilt torch_cudnn_fusion._C, or a just-in-time build on first GPU use."""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from types import ModuleType
from typing import Callable

import torch

from . import _build_paths

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None
_on_load: list[Callable[[], None]] = []


def call_when_loaded(fn: Callable[[], None]) -> None:
    """Runs `fn` once the extension has loaded (at once if it has): how the parts that need the extension at start-up
    (the automatic plan file) hook in without this module importing them."""
    _on_load.append(fn)
    if _module is not None:
        fn()


def _report_progress(build_dir: str, sources: int, done: threading.Event, every_s: float = 15.0) -> None:
    """Prints how far a just-in-time build has got, every `every_s` seconds, until `done` (nothing when the cached
    build loads at once)."""
    start = time.time()
    while not done.wait(every_s):
        try:
            compiled = sum(1 for entry in os.scandir(build_dir)
                           if entry.name.endswith(".o") and entry.stat().st_mtime >= start)
        except OSError:
            compiled = 0
        print(f"torch_cudnn_fusion: building the cuDNN extension: {compiled} of {sources} files compiled, "
              f"{time.time() - start:.0f} s", file=sys.stderr, flush=True)


def _import_prebuilt() -> ModuleType:
    """The _C built by `pip install` (or `setup.py build_ext --inplace`) where torch had CUDA; ModuleNotFoundError
    naming it where there is none (`from . import _C` would raise a plain ImportError then, as for a broken one)."""
    return importlib.import_module(f"{__package__}._C")


def _prebuilt_problem(exc: ImportError) -> str | None:
    """Why a prebuilt _C that is there did not import (an undefined symbol from a build for another torch, a library
    not found, a damaged file), or None where there is none for this Python (a source checkout, a CPU-only install)."""
    if isinstance(exc, ModuleNotFoundError) and exc.name == f"{__package__}._C":
        return None
    return f"the prebuilt {__package__}._C did not import ({exc})"


def _jit_build(why: str | None = None) -> ModuleType:
    from torch.utils import cpp_extension

    cuda_home = _build_paths.cuda_home(cpp_extension.CUDA_HOME, torch.version.cuda)
    if cuda_home is None:
        raise _build_paths.BuildSetupError(
            "the CUDA toolkit was not found (CUDA_HOME is unset and nvcc is not on PATH): install the toolkit "
            f"matching torch's CUDA {torch.version.cuda}, or install a build of torch_cudnn_fusion made with it"
        )
    cpp_extension.CUDA_HOME = str(cuda_home)  # torch's guess may be a folder with no toolkit in it
    name = "torch_cudnn_fusion_C"
    build_dir = cpp_extension._get_build_directory(name, verbose=False)
    csrc = _build_paths.csrc_dir()
    sources = [str(p) for p in _build_paths.sources(csrc)]
    includes = [str(csrc), str(_build_paths.frontend_include_dir()), str(_build_paths.cudnn_include_dir())]
    libstdcxx, note = _build_paths.libstdcxx_link_args(os.environ.get("CXX", "c++"), build_dir)
    if note:
        print(f"torch_cudnn_fusion: {note}", file=sys.stderr, flush=True)
    print(
        (f"torch_cudnn_fusion: {why}. " if why else "torch_cudnn_fusion: ")
        + "loading the cuDNN extension from torch's extension cache, building it first if it is "
        f"not there ({build_dir}; a few minutes with one core per file)...",
        file=sys.stderr,
        flush=True,
    )
    done = threading.Event()
    threading.Thread(target=_report_progress, args=(build_dir, len(sources), done), daemon=True).start()
    try:
        return cpp_extension.load(
            name=name,
            sources=sources,
            extra_include_paths=includes,
            extra_cflags=_build_paths.COMPILE_ARGS,
            extra_cuda_cflags=["-O3"],
            extra_ldflags=libstdcxx + _build_paths.link_args(),
            with_cuda=True,
            is_python_module=True,
            verbose=False,
        )
    finally:
        done.set()


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
            module = _import_prebuilt()
        except ImportError as prebuilt_exc:
            why = _prebuilt_problem(prebuilt_exc)
            try:
                module = _jit_build(why)
            except Exception as exc:  # a failed build must not crash the model: layers run eager and say why
                _error = f"the cuDNN extension could not be built: {exc}" + (f"; {why}" if why else "")
                return None
        from .ops import library

        library.register_python_parts()
        _module = module
    for fn in _on_load:
        fn()
    return _module


def load_error() -> str | None:
    """Why load() returned None: set whenever it has (None before the first load() and once the module loaded)."""
    return _error


def require() -> ModuleType:
    """The compiled module, or a RuntimeError saying why it is unavailable."""
    module = load()
    if module is None:
        raise RuntimeError(f"torch_cudnn_fusion: {_error}")
    return module
