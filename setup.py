"""Builds the cuDNN extension ahead of time where torch has CUDA; elsewhere installs the pure-Python package,
which runs every module as its eager composition (and builds the extension just in time on first GPU use).

Install with `pip install --no-build-isolation .` so the build sees the torch it will run with.
Set TCF_BUILD_EXTENSION=0 to skip the ahead-of-time build.
"""

import importlib.util
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _load_build_paths():
    spec = importlib.util.spec_from_file_location("_build_paths", ROOT / "torch_cudnn_fusion" / "_build_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithSources(build_py):
    """Ships csrc/ inside the package (as _csrc) for the just-in-time build."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "torch_cudnn_fusion" / "_csrc"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(ROOT / "csrc", target)


def _extension_modules():
    if os.environ.get("TCF_BUILD_EXTENSION", "1") == "0":
        return [], {}
    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is None or cpp_extension.CUDA_HOME is None:
        print("torch_cudnn_fusion: torch has no CUDA (or no CUDA toolkit found): installing without the "
              "extension; layers run eager until a GPU build is available")
        return [], {}
    paths = _load_build_paths()
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.c[pu]*"))
    extension = cpp_extension.CUDAExtension(
        "torch_cudnn_fusion._C",
        sources=sources,
        include_dirs=[str(paths.frontend_include_dir()), str(paths.cudnn_include_dir())],
        extra_compile_args={"cxx": paths.COMPILE_ARGS, "nvcc": ["-O3"]},
        extra_link_args=paths.link_args(),
    )
    return [extension], {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extension_modules()
cmdclass["build_py"] = BuildPyWithSources
setup(ext_modules=ext_modules, cmdclass=cmdclass)
