"""benchmarks/batch_norm_forward_phases.py, the probe of our BatchNorm forward kernel's phases, without a GPU: its
patches apply to today's kernel (so a kernel edit that breaks them fails here, not on the next GPU run), a kernel it
does not know is refused by name, the patched copy compiles with the harness where a CUDA toolkit is found, and the
harness's lines are read back."""

import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import batch_norm_forward_phases as probe  # noqa: E402


def test_every_patch_applies_to_the_kernel():
    patched = probe.patched_kernel(probe.KERNEL.read_text())
    for stamp in range(5):
        assert f"PROBE_STAMP({stamp});" in patched
    assert "atomicMax(&g_stamps[5], probe_time())" in patched
    for stamp in range(4):
        assert f"PROBE_BLOCK_STAMP({stamp});" in patched
    assert patched.count("constexpr int kUnroll = PROBE_UNROLL;") == 2  # the statistics and the apply pass
    assert "#if PROBE_FINALIZE_BATCH" in patched
    assert "const auto shape = probe_launch_shape(a.rows, a.channels, V, multiprocessors);" in patched
    assert "#define PROBE_KERNEL_SHAPE forward_launch(rows, channels, vector, multiprocessors)" in patched
    assert "if (!g_force_three && nhwc::cooperative_grid_fits(kernel" in patched
    # x in shared: kept by the statistics pass, read back by both of the apply pass's loads, and its room asked for
    # only the one launch keeps rows: it alone passes probe_cache_on (the three launches' passes take the default)
    assert patched.count("const bool probe_caching = PROBE_CACHE_ROWS > 0 && probe_cache_on;") == 2
    assert patched.count("bool probe_cache_on = false) {") == 2
    assert "a.rows, a.channels, shared, true);\n  PROBE_STAMP(1);" in patched
    assert "apply_rows<T, V, kResidual, kAct>(a, true);" in patched
    assert "batch_norm_act_forward_statistics" in patched and "apply_rows<T, V, kResidual, kAct>(a);" in patched
    assert "if (probe_caching && probe_k < PROBE_CACHE_ROWS) probe_cache[probe_k * probe_threads] = p;" in patched
    assert "probe_caching && k - u < PROBE_CACHE_ROWS ? probe_cache[(k - u) * probe_threads]" in patched
    assert "process(probe_caching && k < PROBE_CACHE_ROWS ? probe_cache[k * probe_threads]" in patched
    assert "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize" in patched
    assert "if (room != cudaSuccess) return room;" in patched


def test_an_older_kernel_launched_at_row_launchs_shape_is_patched_too():
    """--kernel probes a version from before forward_launch (a595ddf's, 2026-12-07b's A/B): its variant "main" is then
    row_launch at kBlocksPerMultiprocessor, as that kernel launched."""
    new, old = probe.SHAPE_LINES.values()
    source = probe.KERNEL.read_text().replace(new, old)
    patched = probe.patched_kernel(source)
    assert ("#define PROBE_KERNEL_SHAPE nhwc::row_launch(rows, channels, vector, multiprocessors, "
            "kBlocksPerMultiprocessor)") in patched
    assert "const auto shape = probe_launch_shape(a.rows, a.channels, V, multiprocessors);" in patched
    with pytest.raises(SystemExit, match="no launch-shape line"):
        probe.patched_kernel(source.replace(old, "  auto shape = nhwc::row_launch(a.rows, a.channels, V, 132, 2);"))


def test_a_kernel_the_probe_does_not_know_is_refused_by_name():
    source = probe.KERNEL.read_text().replace("  grid.sync();\n  finalize_tiles",
                                              "  grid.sync();  // moved\n  finalize_tiles")
    with pytest.raises(SystemExit, match="the kernel has changed: 0 places match the patch that starts "
                                         "'statistics_rows<T, V>"):
        probe.patched_kernel(source)


def test_the_harness_lines_are_read_back():
    output = ("device,NVIDIA H200,132\n"
              "bits,64,14,00000000000000ab00000000000000cd00000000000000ef\n"
              "row,64,14,0,main,31.20,33.00,4.10,1,264,8,32,0,3.10,2.20,4.30,2.00,6.50\n"
              "row,192,28,2,three launches,80.00,81.00,30.00,1,264,24,10,0.0078125,0.00,0.00,0.00,0.00,0.00\n"
              "row,64,14,0,1 block/SM,16.00,17.00,3.10,1,132,8,32,0,3.0,1.0,2.0,1.0,6.7,"
              "0.40,3.10,4.20,9.00,9.60,10.30,14.00,16.20\n")
    device, rows, bits = probe.parse(output, "unroll 4")
    assert device == "NVIDIA H200 (132 multiprocessors)"
    assert bits == {"64@14": "00000000000000ab00000000000000cd00000000000000ef"}
    assert rows[0] == {"build": "unroll 4", "channels": 64, "size": 14, "activation": "none", "variant": "main",
                       "graph_us": 31.2, "issued_us": 33.0, "copy_us": 4.1, "grid": [1, 264], "block": [8, 32],
                       "max_difference": 0.0,
                       "phases_us": {"statistics": 3.1, "barrier 1": 2.2, "finalize": 4.3, "barrier 2": 2.0,
                                     "apply": 6.5},
                       "blocks_us": {}}  # a row from before the blocks' stamps
    assert rows[1]["activation"] == "relu6" and rows[1]["variant"] == "three launches"
    assert rows[1]["max_difference"] == 0.0078125
    assert rows[2]["blocks_us"] == {"latest start": 0.4, "statistics end median": 3.1, "statistics end latest": 4.2,
                                    "barrier 2 exit earliest": 9.0, "barrier 2 exit median": 9.6,
                                    "barrier 2 exit latest": 10.3, "end median": 14.0, "end latest": 16.2}


def test_the_harness_variant_names_hold_no_comma():
    """The harness prints comma-separated lines with the variant's name as a field: a comma in a name (once "three,
    rows >= 32") broke parse() on the GPU, after the builds and the runs."""
    harness = (probe.HERE / "batch_norm_forward_phases.cu").read_text()
    table = harness[harness.index("const Variant variants[] = {"):]
    names = re.findall(r'\{"([^"]*)", \d', table[:table.index("};")])
    assert len(names) == 8 and names[:2] == ["main", "2 blocks/SM"]
    assert [name for name in names if "," in name] == []


def test_the_reference_bits_are_compared_shape_by_shape():
    ours = {"64@14": "a1", "96@14": "b2", "160@7": "c3"}
    assert probe.same_bits(ours, dict(ours), "old.json") == (
        "the reference's bits (y, saved mean and invstd) as old.json's on 3 of 3 shapes")
    assert probe.same_bits(ours, {"64@14": "a1", "96@14": "b0"}, "old.json") == (
        "the reference's bits (y, saved mean and invstd) as old.json's on 1 of 3 shapes; differ: 96@14; "
        "differ: 160@7")


def test_the_patched_kernel_compiles_with_the_harness(tmp_path):
    try:
        probe.nvcc()
    except SystemExit:
        pytest.skip("no CUDA toolkit here")
    (tmp_path / "bnf_patched.cu").write_text(probe.patched_kernel(probe.KERNEL.read_text()))
    shutil.copy(probe.HERE / "batch_norm_forward_phases.cu", tmp_path / "batch_norm_forward_phases.cu")
    # one build with every code path the probe adds behind a macro: the finalize's batched loads, rows unrolled 8,
    # x kept in shared memory
    flags = ["-DPROBE_UNROLL=8", "-DPROBE_FINALIZE_BATCH=1", "-DPROBE_CACHE_ROWS=20"]
    assert probe.build(tmp_path, "every probe path", flags).is_file()
