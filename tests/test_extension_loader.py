"""The extension loader's reasons, on the CPU: a prebuilt _C that is there but does not import is named, with its
ImportError, in the just-in-time build's message and in load_error() when that build fails too; a missing _C is not
a problem to report."""

import importlib.machinery
import importlib.util

import pytest
import torch

from torch_cudnn_fusion import _extension

PREBUILT = "torch_cudnn_fusion._C"


def test_no_prebuilt_module_is_not_a_problem():
    if importlib.util.find_spec(PREBUILT) is not None:
        pytest.skip("this install has a prebuilt _C")
    with pytest.raises(ModuleNotFoundError) as caught:
        _extension._import_prebuilt()
    assert _extension._prebuilt_problem(caught.value) is None


def test_a_prebuilt_file_that_is_not_a_library_is_named(tmp_path, monkeypatch):
    import torch_cudnn_fusion

    if importlib.util.find_spec(PREBUILT) is not None:
        pytest.skip("this install has a prebuilt _C")
    (tmp_path / f"_C{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"not an ELF file")
    monkeypatch.setattr(torch_cudnn_fusion, "__path__", [*torch_cudnn_fusion.__path__, str(tmp_path)])
    with pytest.raises(ImportError) as caught:
        _extension._import_prebuilt()
    problem = _extension._prebuilt_problem(caught.value)
    assert problem is not None and str(tmp_path) in problem


@pytest.mark.parametrize("exc", [
    ImportError("/site/torch_cudnn_fusion/_C.so: undefined symbol: _ZN3tcf4initEv"),
    ImportError("libcudnn.so.9: cannot open shared object file: No such file or directory"),
    ModuleNotFoundError("No module named 'torch_cudnn_fusion.ops.missing'", name="torch_cudnn_fusion.ops.missing"),
])
def test_a_prebuilt_module_that_does_not_import_is_named_with_its_error(exc):
    problem = _extension._prebuilt_problem(exc)
    assert problem is not None and PREBUILT in problem and str(exc) in problem


@pytest.fixture
def fresh_loader(monkeypatch):
    """load() as on a GPU machine that has not loaded the extension yet (the state is restored afterwards)."""
    monkeypatch.setattr(_extension, "_module", None)
    monkeypatch.setattr(_extension, "_error", None)
    monkeypatch.setattr(_extension, "_on_load", [])
    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def _load_failing_to_build(monkeypatch, prebuilt_error):
    """load() with the prebuilt import raising `prebuilt_error` and the just-in-time build failing; the reasons the
    build was given, and load_error()."""

    asked = []

    def build(why=None):
        asked.append(why)
        raise RuntimeError("nvcc not found")

    monkeypatch.setattr(_extension, "_import_prebuilt", _raising(prebuilt_error))
    monkeypatch.setattr(_extension, "_jit_build", build)
    assert _extension.load() is None
    return asked, _extension.load_error()


def test_a_failed_build_after_a_broken_prebuilt_module_gives_both_reasons(fresh_loader, monkeypatch):
    asked, error = _load_failing_to_build(monkeypatch, ImportError("undefined symbol: _ZN3tcf4initEv"))
    assert len(asked) == 1 and "undefined symbol: _ZN3tcf4initEv" in asked[0]
    assert "could not be built: nvcc not found" in error and "undefined symbol: _ZN3tcf4initEv" in error


def test_a_failed_build_without_a_prebuilt_module_gives_the_build_error_alone(fresh_loader, monkeypatch):
    asked, error = _load_failing_to_build(monkeypatch, ModuleNotFoundError(name=PREBUILT))
    assert asked == [None]
    assert error == "the cuDNN extension could not be built: nvcc not found"


def test_the_build_names_the_prebuilt_problem_first(tmp_path, monkeypatch, capsys):
    """_jit_build's own first line carries the reason it was given (the build stopped at cpp_extension.load)."""
    from torch.utils import cpp_extension

    from torch_cudnn_fusion import _build_paths

    for name in ("frontend_include_dir", "cudnn_include_dir"):
        monkeypatch.setattr(_build_paths, name, lambda: tmp_path)
    monkeypatch.setattr(_build_paths, "cuda_home", lambda *args: tmp_path)
    monkeypatch.setattr(_build_paths, "libstdcxx_link_args", lambda *args: ([], ""))
    monkeypatch.setattr(_build_paths, "link_args", lambda: [])
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", cpp_extension.CUDA_HOME)  # _jit_build sets it: restored after
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda *args, **kwargs: str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", _raising(RuntimeError("stopped before compiling")))
    why = _extension._prebuilt_problem(ImportError("undefined symbol: _ZN3tcf4initEv"))
    with pytest.raises(RuntimeError, match="stopped before compiling"):
        _extension._jit_build(why)
    first = _first_line_of_ours(capsys.readouterr().err)
    assert first.startswith(f"torch_cudnn_fusion: {why}. loading the cuDNN extension"), first
    with pytest.raises(RuntimeError, match="stopped before compiling"):
        _extension._jit_build(None)
    first = _first_line_of_ours(capsys.readouterr().err)
    assert first.startswith("torch_cudnn_fusion: loading the cuDNN extension"), first


def _first_line_of_ours(err: str) -> str:
    """The first stderr line the package wrote (torch's cpp_extension may warn before it)."""
    return next(line for line in err.splitlines() if line.startswith("torch_cudnn_fusion: "))


def _raising(exc):
    def fn(*args, **kwargs):
        raise exc
    return fn
