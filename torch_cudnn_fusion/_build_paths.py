"""Where the build finds cuDNN and cudnn-frontend. Shared by setup.py and the just-in-time build.

Imports nothing of this package, so setup.py can load it by path.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

FRONTEND_PIN = "nvidia-cudnn-frontend==1.16.0"


class BuildSetupError(RuntimeError):
    """A file the C++ extension needs to build is missing; the message says which and how to get it."""


def frontend_include_dir() -> Path:
    """cudnn-frontend's C++ headers, shipped under include/ by the nvidia-cudnn-frontend package."""
    override = os.environ.get("TCF_CUDNN_FRONTEND_INCLUDE")
    candidates = [Path(override)] if override else []
    try:
        candidates.append(Path(importlib.metadata.distribution("nvidia-cudnn-frontend").locate_file("include")))
    except importlib.metadata.PackageNotFoundError:
        pass
    for path in candidates:
        if (path / "cudnn_frontend.h").is_file():
            return path
    raise BuildSetupError(
        "cudnn-frontend headers not found (cudnn_frontend.h): install them with "
        f"`pip install {FRONTEND_PIN}`, or set TCF_CUDNN_FRONTEND_INCLUDE to a folder holding cudnn_frontend.h"
    )


def _cudnn_package_dir() -> Path | None:
    """The nvidia-cudnn-cu* package torch loads its cuDNN from (site-packages/nvidia/cudnn)."""
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def cudnn_include_dir() -> Path:
    override = os.environ.get("CUDNN_INCLUDE_DIR")
    package = _cudnn_package_dir()
    candidates = [Path(override)] if override else []
    if package is not None:
        candidates.append(package / "include")
    for path in candidates:
        if (path / "cudnn.h").is_file():
            return path
    raise BuildSetupError(
        "cuDNN headers not found (cudnn.h): the extension builds against the cuDNN torch loads, from the "
        "nvidia-cudnn-cu* package beside torch. Install the one matching torch.backends.cudnn.version() "
        "(e.g. `pip install nvidia-cudnn-cu13`), or set CUDNN_INCLUDE_DIR"
    )


def cudnn_library_dir() -> Path:
    override = os.environ.get("CUDNN_LIBRARY_DIR")
    package = _cudnn_package_dir()
    candidates = [Path(override)] if override else []
    if package is not None:
        candidates.append(package / "lib")
    for path in candidates:
        if (path / "libcudnn.so.9").exists():
            return path
    raise BuildSetupError(
        "libcudnn.so.9 not found: the extension links the cuDNN torch loads, from the nvidia-cudnn-cu* package "
        "beside torch; install it or set CUDNN_LIBRARY_DIR"
    )


# libtorch_cuda carries its own copy of cudnn-frontend (another version, same names). Our copy's inline functions
# must bind to our own definitions: hidden visibility, and -Bsymbolic for whatever stays exported.
COMPILE_ARGS = ["-O2", "-fvisibility=hidden", "-fvisibility-inlines-hidden"]


def link_args() -> list[str]:
    """Link the cuDNN torch already loads (same soname, same folder): never a second cuDNN in the process."""
    lib = cudnn_library_dir()
    return [f"-L{lib}", "-l:libcudnn.so.9", f"-Wl,-rpath,{lib}", "-Wl,-Bsymbolic"]


def csrc_dir() -> Path:
    """The C++ sources: csrc/ of a source checkout, or the copy setup.py puts in the installed package."""
    here = Path(__file__).resolve().parent
    for path in (here.parent / "csrc", here / "_csrc"):
        if (path / "bindings.cpp").is_file():
            return path
    raise BuildSetupError(f"the C++ sources (csrc/bindings.cpp) are missing next to {here}; reinstall the package")
