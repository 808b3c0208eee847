"""Where the build finds cuDNN and cudnn-frontend. Shared by setup.py and the just-in-time build.

Imports nothing of this package, so setup.py can load it by path.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shlex
import subprocess
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
# -g0: Python's own CFLAGS (which setuptools passes) ask for debug information, which cost about 40 % of the compile
# time of the files that include cudnn-frontend and made the library 83 MB (conv_graphs.o: 50 MB with it, 1.8 MB
# without). TCF_DEBUG_INFO=1 keeps it.
COMPILE_ARGS = ["-O2", "-fvisibility=hidden", "-fvisibility-inlines-hidden"] + (
    [] if os.environ.get("TCF_DEBUG_INFO") == "1" else ["-g0"])


def link_args() -> list[str]:
    """Link the cuDNN torch already loads (same soname, same folder): never a second cuDNN in the process."""
    lib = cudnn_library_dir()
    return [f"-L{lib}", "-l:libcudnn.so.9", f"-Wl,-rpath,{lib}", "-Wl,-Bsymbolic"]


def _loaded_libstdcxx() -> Path | None:
    """The libstdc++ shared library this process has loaded (the one torch runs with), or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if Path(path).name.startswith("libstdc++.so"):
            return Path(path)
    return None


def libstdcxx_link_args(cxx: str, build_dir: Path) -> tuple[list[str], str]:
    """Link flags that make the compiler `cxx` link the libstdc++ torch loads, and a note ('' when none are needed).

    g++ links libstdc++.so where its library path has one, else libstdc++.a. A relocated GCC whose library folder
    holds only libstdc++.a (the GPU image's /opt/gcc/bin/g++, Ubuntu's GCC 13.3 moved there) put a second C++
    runtime into the extension beside the libstdc++.so.6 torch loads; the two disagree on std::locale's facet ids and
    the first `std::stringstream << long` (in cudnn-frontend) segfaulted. The headers and _GLIBCXX_* macros were the
    same. Where `cxx` would link statically, a folder holding libstdc++.so -> the loaded library goes first on the
    library path, so the extension needs libstdc++.so.6 like torch. Call it in a process that has imported torch.
    """
    try:
        found = subprocess.run([*shlex.split(cxx), "-print-file-name=libstdc++.so"], capture_output=True, text=True,
                               timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError, ValueError):
        return [], ""  # no such compiler: the build itself says so
    if os.path.isabs(found) and os.path.exists(found):
        return [], ""
    loaded = _loaded_libstdcxx()
    if loaded is None:
        raise BuildSetupError(
            f"the C++ compiler {cxx} has no libstdc++.so on its library path and would link libstdc++.a into the "
            "extension: a second C++ runtime beside the one torch loads, which crashes in std::stringstream. Set "
            "CXX and CC to a compiler that links libstdc++.so (e.g. CXX=/usr/bin/g++ CC=/usr/bin/gcc)")
    folder = Path(build_dir) / "libstdcxx"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "libstdc++.so"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(loaded)
    note = (f"the C++ compiler {cxx} has no libstdc++.so on its library path (it would link libstdc++.a, a second C++ "
            f"runtime beside torch's, which crashed in std::stringstream): linking {loaded}, the one torch loads")
    return [f"-L{folder}"], note


def _is_toolkit(path) -> bool:
    return bool(path) and (Path(path) / "include" / "cuda_runtime_api.h").is_file() and (
        Path(path) / "bin" / "nvcc").exists()


def cuda_home(torch_guess: str | None, torch_cuda: str | None) -> Path | None:
    """The CUDA toolkit to build with, or None where there is none.

    $CUDA_HOME (or $CUDA_PATH) when set, and then it must be a toolkit; else the first toolkit of torch's guess,
    /usr/local/cuda-<torch's CUDA> and /usr/local/cuda. torch guesses from the nvcc on PATH, and an nvcc that is a
    wrapper script in /usr/local/bin made it guess /usr/local, where no CUDA header is.
    """
    explicit = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if explicit:
        if not _is_toolkit(explicit):
            raise BuildSetupError(
                f"CUDA_HOME={explicit} is not a CUDA toolkit (no include/cuda_runtime_api.h and bin/nvcc there): set "
                f"CUDA_HOME to the toolkit's folder (e.g. /usr/local/cuda-{torch_cuda or 'X.Y'}), or unset it")
        return Path(explicit)
    for candidate in (torch_guess, f"/usr/local/cuda-{torch_cuda}" if torch_cuda else None, "/usr/local/cuda"):
        if _is_toolkit(candidate):
            return Path(candidate)
    return None


def csrc_dir() -> Path:
    """The C++ sources: csrc/ of a source checkout, or the copy setup.py puts in the installed package."""
    here = Path(__file__).resolve().parent
    for path in (here.parent / "csrc", here / "_csrc"):
        if (path / "ops" / "bindings.cpp").is_file():
            return path
    raise BuildSetupError(f"the C++ sources (csrc/ops/bindings.cpp) are missing next to {here}; reinstall the package")


def sources(csrc: Path) -> list[Path]:
    """Every C++ and CUDA source under csrc/ (core/, graphs/, kernels/, ops/); they include each other's headers by
    their path under csrc/, which the build therefore puts on the include path."""
    return sorted(p for p in csrc.rglob("*") if p.suffix in (".cpp", ".cu"))
