"""The build's environment checks: the CUDA toolkit it picks and the C++ runtime it links."""

import os
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch  # noqa: F401  (loads the libstdc++ the extension must link)

from torch_cudnn_fusion import _build_paths

PROBE = textwrap.dedent("""
    #include <sstream>
    #include <string>
    extern "C" __attribute__((visibility("default"))) const char* format_long(long v) {
      static std::string s;
      std::stringstream o;
      o << "v=" << v << " f=" << 1.5;
      s = o.str();
      return s.c_str();
    }
""")


def _fake_toolkit(root):
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_runtime_api.h").write_text("")
    (root / "bin").mkdir()
    (root / "bin" / "nvcc").write_text("")
    return root


def test_cuda_home_prefers_a_real_toolkit_over_torchs_guess(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    toolkit = _fake_toolkit(tmp_path / "cuda")
    assert _build_paths.cuda_home(str(toolkit), "13.0") == toolkit
    # torch guessed /usr/local from an nvcc wrapper there: a folder with no CUDA header is not taken
    guess = _build_paths.cuda_home(str(tmp_path), "13.0")
    assert guess != tmp_path and (guess is None or _build_paths._is_toolkit(guess))


def test_cuda_home_names_a_wrong_cuda_home(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(_build_paths.BuildSetupError, match=r"CUDA_HOME=.* is not a CUDA toolkit.*set CUDA_HOME"):
        _build_paths.cuda_home(None, "13.0")


def test_a_compiler_without_libstdcxx_so_links_the_one_torch_loads(tmp_path):
    compiler = tmp_path / "g++"  # answers as /opt/gcc/bin/g++ does: no libstdc++.so on its library path
    compiler.write_text("#!/bin/sh\necho libstdc++.so\n")
    compiler.chmod(0o755)
    args, note = _build_paths.libstdcxx_link_args(str(compiler), tmp_path / "build")
    loaded = _build_paths._loaded_libstdcxx()
    assert loaded is not None and loaded.name.startswith("libstdc++.so")
    assert args == [f"-L{tmp_path / 'build' / 'libstdcxx'}"]
    assert os.path.realpath(tmp_path / "build" / "libstdcxx" / "libstdc++.so") == os.path.realpath(loaded)
    assert "would link libstdc++.a" in note and str(loaded) in note


def _compiler():
    cxx = os.environ.get("CXX", "c++")
    return cxx if shutil.which(shlex.split(cxx)[0]) else None


@pytest.mark.skipif(_compiler() is None, reason="no C++ compiler")
def test_a_library_built_with_this_compiler_formats_numbers_beside_torch(tmp_path):
    """The crash the image's /opt/gcc/bin/g++ gave, reproduced in 15 lines: a shared library that formats a long
    with std::stringstream, loaded after torch. Run with that compiler as CXX, it segfaulted without the link flags."""
    cxx = _compiler()
    source = tmp_path / "probe.cpp"
    source.write_text(PROBE)
    library = tmp_path / "probe.so"
    args, _ = _build_paths.libstdcxx_link_args(cxx, tmp_path)
    subprocess.run([*shlex.split(cxx), "-std=c++17", "-O2", "-fPIC", "-shared", *_build_paths.COMPILE_ARGS,
                    str(source), "-o", str(library), *args, "-Wl,-Bsymbolic"], check=True)
    run = subprocess.run([sys.executable, "-c", "import ctypes, torch; lib = ctypes.CDLL(%r); "
                          "lib.format_long.restype = ctypes.c_char_p; print(lib.format_long(42).decode())" % str(library)],
                         capture_output=True, text=True)
    assert run.returncode == 0, f"{cxx}: exit {run.returncode}\n{run.stderr[-2000:]}"
    assert run.stdout.strip() == "v=42 f=1.5"
