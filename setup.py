"""Builds torch_cudnn_fusion: the Python package, and where it can, its cuDNN extension ahead of time.

Install with `pip install --no-build-isolation .`: the extension is compiled against the torch it will run with,
which pip's build isolation would hide. Where the extension is not built now (a CPU build of torch, no CUDA toolkit,
or no GPU and no TORCH_CUDA_ARCH_LIST), the package installs without it, says why, and builds it just in time on
first use on a GPU. TCF_BUILD_EXTENSION=0 skips the ahead-of-time build.
"""

import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
notes = []  # why the extension was not built now; installed as _build_note.txt, shown by `python -m torch_cudnn_fusion info`


def _note(text: str) -> None:
    print(f"torch_cudnn_fusion: {text}", file=sys.stderr, flush=True)
    notes.append(text)


def _fail(text: str):
    raise SystemExit(f"\ntorch_cudnn_fusion: {text}\n")


def _load_build_paths():
    spec = importlib.util.spec_from_file_location("_build_paths", ROOT / "torch_cudnn_fusion" / "_build_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithSources(build_py):
    """Ships csrc/ inside the package (as _csrc) for the just-in-time build, and the install note."""

    def run(self):
        super().run()
        package = Path(self.build_lib) / "torch_cudnn_fusion"
        shutil.rmtree(package / "_csrc", ignore_errors=True)
        shutil.copytree(ROOT / "csrc", package / "_csrc")
        (package / "_build_note.txt").write_text("\n".join(notes))


def _extension_modules():
    if os.environ.get("TCF_BUILD_EXTENSION", "1") == "0":
        _note("TCF_BUILD_EXTENSION=0: installing without the ahead-of-time build")
        return [], {}
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        _fail("the build needs the torch it will run with, and pip's build isolation hides the installed one (or "
              "torch is not installed): install torch first, then run `pip install --no-build-isolation .`")
    if torch.version.cuda is None:
        _note(f"torch {torch.__version__} is a CPU build: installing without the cuDNN extension (every layer runs "
              "its eager composition)")
        return [], {}
    paths = _load_build_paths()
    try:
        cuda_home = paths.cuda_home(cpp_extension.CUDA_HOME, torch.version.cuda)
    except paths.BuildSetupError as error:
        _fail(str(error))
    if cuda_home is None:
        _note(f"no CUDA toolkit found (nvcc, CUDA_HOME): installing without the ahead-of-time build; install the "
              f"CUDA {torch.version.cuda} toolkit (or set CUDA_HOME) to build it, now or just in time on a GPU")
        return [], {}
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        _note("no GPU here and TORCH_CUDA_ARCH_LIST is unset: installing without the ahead-of-time build (it builds "
              "just in time on first use on a GPU); to build now for a GPU generation, e.g. Hopper: "
              "TORCH_CUDA_ARCH_LIST=9.0 pip install --no-build-isolation .")
        return [], {}
    cpp_extension.CUDA_HOME = str(cuda_home)  # torch's guess may be a folder with no toolkit in it
    os.environ["CUDA_HOME"] = str(cuda_home)  # for this build process's nvcc calls only
    try:
        include_dirs = [str(ROOT / "csrc"), str(paths.frontend_include_dir()), str(paths.cudnn_include_dir())]
        link_args = paths.link_args()
        # setuptools links C++ extensions with $CXX, else Python's own CXX
        linker = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
        libstdcxx_args, libstdcxx_note = paths.libstdcxx_link_args(linker, ROOT / "build")
    except paths.BuildSetupError as error:
        _fail(str(error))
    if libstdcxx_note:
        print(f"torch_cudnn_fusion: {libstdcxx_note}", file=sys.stderr, flush=True)
    sources = [str(p.relative_to(ROOT)) for p in paths.sources(ROOT / "csrc")]
    extension = cpp_extension.CUDAExtension(
        "torch_cudnn_fusion._C",
        sources=sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": paths.COMPILE_ARGS, "nvcc": ["-O3"]},
        extra_link_args=libstdcxx_args + link_args,
    )
    return [extension], {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extension_modules()
cmdclass["build_py"] = BuildPyWithSources
setup(ext_modules=ext_modules, cmdclass=cmdclass)
