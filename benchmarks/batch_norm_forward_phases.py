"""Where our BatchNorm forward kernel's time goes on small layers: its phases (statistics, first grid barrier,
finalize, second barrier, apply) and its time under other launch shapes, against a copy of the same bytes.

The cuDNN graph's BatchNorm forward took 12-15 us on mobilenet_v2's narrow 14x14 and 7x7 layers at batch 256 where
our kernel took 27-33 (H200, 28ze, batch_norm_forward.py); no layer ran under 26 us in ours. This probe breaks that
down. It needs no torch build of the package: it writes a copy of csrc/kernels/batch_norm_forward_kernel.cu with
  - %globaltimer stamps between the one-launch kernel's phases (block (0, 0), and the latest block's end), and each
    block's start, end of the statistics pass, exit from the second barrier and end (how far apart the blocks run:
    the apply pass's time is counted from block (0, 0)'s exit to the latest block's end), and
  - knobs for the launch shape: blocks per multiprocessor (main: the kernel's own shape; "2 blocks/SM": the one it
    had before 2026-12-07b), three launches in place of one cooperative launch, at least N rows per thread (fewer
    blocks for small layers),
compiles it with batch_norm_forward_phases.cu and nvcc for each build variant (rows unrolled 4 or 8 a step in the
first and last pass; the finalize's loads 4 at a time; "x in shared": a thread's first 20 rows of x kept in shared
memory by the one launch's statistics pass and read back by its apply pass, which took about two copies' time of its
bytes on the narrow layers though x had just been read, 2026-12-07c), and runs each on mobilenet_v2's BatchNorm
shapes (batch 256, bfloat16, NHWC). Each variant's y is held against the reference, y from three launches at two
blocks a multiprocessor: max |dy|. Each patch is asserted to apply, so a changed kernel fails here loudly, not
silently unpatched.

First run (H100, 2026-12-07, benchmarks/results/batch_norm_forward_phases_h100_2026-12-07a.json): on the 64-channel
14x14 layer, 25.0 us, of which the statistics pass took 10.9 (its block sum's shared-memory bank conflicts, since
mended in the kernel), the two barriers 1.3 and 1.1, the finalize 2.1 and the apply pass 8.4; a copy of x and y took
3.1. Mended (the block sum laid out [v][y][x]), the layer took 18.4 us and its statistics pass 4.0, with the same
bits on all 15 shapes (2026-12-07b, benchmarks/results/batch_norm_forward_phases_a39aa61_h100_2026-12-07b.json). In
the first run a fourth build, "one barrier" (each block adding all parts of its own channels' sums, no finalize pass and
no second barrier), was slower on every shape, 1.3x to 10x, and was dropped.

    python benchmarks/batch_norm_forward_phases.py [--json out.json] [--keep DIR] [--builds NAME ...]
        [--kernel OTHER.cu --bits-of out.json]    (the same bits from another version of the kernel?)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNEL = HERE.parent / "csrc" / "kernels" / "batch_norm_forward_kernel.cu"
sys.path.insert(0, str(HERE.parent))  # torch_cudnn_fusion._build_paths from this checkout

# (name, -D flags): rows per step in the statistics and apply passes; the finalize's loads issued 4 at a time; x kept
# in shared memory between the one launch's statistics and apply passes (a thread's first PROBE_CACHE_ROWS rows)
BUILDS = [("unroll 4", ["-DPROBE_UNROLL=4", "-DPROBE_FINALIZE_BATCH=0"]),
          ("unroll 8", ["-DPROBE_UNROLL=8", "-DPROBE_FINALIZE_BATCH=0"]),
          ("finalize loads x4", ["-DPROBE_UNROLL=4", "-DPROBE_FINALIZE_BATCH=1"]),
          ("x in shared", ["-DPROBE_UNROLL=4", "-DPROBE_FINALIZE_BATCH=0", "-DPROBE_CACHE_ROWS=20"])]

KNOBS = """__device__ unsigned long long g_stamps[8];
// each block's start, end of the statistics pass (before barrier 1), exit from barrier 2 and end
constexpr int kMostBlocks = 4096;
__device__ unsigned long long g_block_stamps[kMostBlocks][4];
int g_blocks_per_sm = 2;
int g_force_three = 0;
int g_min_rows_per_thread = 0;
__device__ inline unsigned long long probe_time() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
#define PROBE_STAMP(i) \\
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) g_stamps[i] = probe_time()
#define PROBE_BLOCK_STAMP(i) \\
  if (threadIdx.x == 0 && threadIdx.y == 0) g_block_stamps[blockIdx.y * gridDim.x + blockIdx.x][i] = probe_time()
#ifndef PROBE_CACHE_ROWS
#define PROBE_CACHE_ROWS 0
#endif
"""

# "x in shared": in the one cooperative launch (not the three launches, whose passes do not share memory: the one
# launch alone passes probe_cache_on), the statistics pass keeps each row it reads, a thread's first PROBE_CACHE_ROWS,
# in dynamic shared memory after the block-sum and finalize region ([k][thread], 16-byte packs side by side: no bank
# conflicts), and the apply pass reads them there instead of from L2. Declared at the top of both passes:
CACHE_DECLARATIONS = """  extern __shared__ __align__(16) float probe_shared[];
  const bool probe_caching = PROBE_CACHE_ROWS > 0 && probe_cache_on;
  const int probe_threads = blockDim.x * blockDim.y;
  P* const probe_cache = reinterpret_cast<P*>(probe_shared + (4 * V * probe_threads > kFinalizeFloats
      ? 4 * V * probe_threads : kFinalizeFloats)) + threadIdx.y * blockDim.x + threadIdx.x;  // row k at [k * threads]
"""

# Before the launch function: the launch shape with the knobs (the kernel's own, PROBE_KERNEL_SHAPE, where
# g_blocks_per_sm is 0), inserted before launch_passes (after the kernel's forward_launch, where it has one).
LAUNCH_SHAPE = """// the kernel's shape, or row_launch's at g_blocks_per_sm a multiprocessor; grid.y cut to
// give each thread at least g_min_rows_per_thread rows
inline nhwc::Launch probe_launch_shape(int64_t rows, int64_t channels, int vector, int multiprocessors) {
  auto shape = g_blocks_per_sm > 0 ? nhwc::row_launch(rows, channels, vector, multiprocessors, g_blocks_per_sm)
                                   : PROBE_KERNEL_SHAPE;
  if (g_min_rows_per_thread > 0) {
    const int64_t most = std::max<int64_t>(1, rows / (static_cast<int64_t>(shape.block.y) * g_min_rows_per_thread));
    shape.grid.y = static_cast<unsigned>(std::min<int64_t>(shape.grid.y, most));
  }
  return shape;
}

"""
LAUNCH_PASSES = "template <typename T, int V, bool kResidual, Act kAct>\ncudaError_t launch_passes("
# the launch shape's line in launch_passes: forward_launch (one block a multiprocessor on the small layers, from
# 2026-12-07b), or before it row_launch at kBlocksPerMultiprocessor (--kernel takes both)
SHAPE_LINES = {
    "forward_launch(rows, channels, vector, multiprocessors)":
        "  const auto shape = forward_launch(a.rows, a.channels, V, multiprocessors);",
    "nhwc::row_launch(rows, channels, vector, multiprocessors, kBlocksPerMultiprocessor)":
        "  const auto shape = nhwc::row_launch(a.rows, a.channels, V, multiprocessors, kBlocksPerMultiprocessor);"}

FINALIZE_LOOP = """        for (int p = lane; p < parts; p += kLanes) {
          const double* at = a.partial + static_cast<int64_t>(p) * a.channels + c;
          sum += __ldcg(at);
          sum_sq += __ldcg(at + stride);
        }"""

FINALIZE_BATCHED = """#if PROBE_FINALIZE_BATCH
        int p = lane;
        for (; p + 3 * kLanes < parts; p += 4 * kLanes) {  // four parts' loads issued before their sums
          double s[4], q[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const double* at = a.partial + static_cast<int64_t>(p + u * kLanes) * a.channels + c;
            s[u] = __ldcg(at);
            q[u] = __ldcg(at + stride);
          }
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            sum += s[u];
            sum_sq += q[u];
          }
        }
        for (; p < parts; p += kLanes) {
          const double* at = a.partial + static_cast<int64_t>(p) * a.channels + c;
          sum += __ldcg(at);
          sum_sq += __ldcg(at + stride);
        }
#else
""" + FINALIZE_LOOP + "\n#endif"

ONE_LAUNCH = """  statistics_rows<T, V>(static_cast<const T*>(a.x), a.partial, a.rows, a.channels, shared);
  grid.sync();
  finalize_tiles(a, static_cast<int>(gridDim.y), shared);
  grid.sync();
  apply_rows<T, V, kResidual, kAct>(a);"""

ONE_LAUNCH_STAMPED = """  PROBE_STAMP(0);
  PROBE_BLOCK_STAMP(0);
  statistics_rows<T, V>(static_cast<const T*>(a.x), a.partial, a.rows, a.channels, shared, true);
  PROBE_STAMP(1);
  PROBE_BLOCK_STAMP(1);
  grid.sync();
  PROBE_STAMP(2);
  finalize_tiles(a, static_cast<int>(gridDim.y), shared);
  PROBE_STAMP(3);
  grid.sync();
  PROBE_STAMP(4);
  PROBE_BLOCK_STAMP(2);
  apply_rows<T, V, kResidual, kAct>(a, true);
  __syncthreads();
  PROBE_BLOCK_STAMP(3);
  if (threadIdx.x == 0 && threadIdx.y == 0) atomicMax(&g_stamps[5], probe_time());"""


def patched_kernel(source: str) -> str:
    """The kernel's source with the probe's stamps and knobs; each replacement asserted to apply once."""
    kernel_shape = next((shape for shape, line in SHAPE_LINES.items() if line in source), None)
    if kernel_shape is None:
        raise SystemExit("batch_norm_forward_phases: the kernel has changed: no launch-shape line of "
                         f"{list(SHAPE_LINES.values())} in it; update the probe")
    replacements = [
        ("namespace tcf {\nnamespace {", "namespace tcf {\n" + KNOBS + "namespace {"),
        ("constexpr int kUnroll = 4;  // four rows a step", "constexpr int kUnroll = PROBE_UNROLL;  // rows a step"),
        ("  constexpr int kUnroll = 4;\n  for (; k >= kUnroll - 1",
         "  constexpr int kUnroll = PROBE_UNROLL;\n  for (; k >= kUnroll - 1"),
        (FINALIZE_LOOP, FINALIZE_BATCHED),
        (ONE_LAUNCH, ONE_LAUNCH_STAMPED),
        (LAUNCH_PASSES, "#define PROBE_KERNEL_SHAPE " + kernel_shape + "\n" + LAUNCH_SHAPE + LAUNCH_PASSES),
        (SHAPE_LINES[kernel_shape], "  const auto shape = probe_launch_shape(a.rows, a.channels, V, multiprocessors);"),
        ("  if (nhwc::cooperative_grid_fits(kernel", "  if (!g_force_three && nhwc::cooperative_grid_fits(kernel"),
        # x in shared (PROBE_CACHE_ROWS > 0): the statistics pass keeps its rows, the apply pass reads them back
        ("                                float* shared_floats) {\n",
         "                                float* shared_floats, bool probe_cache_on = false) {\n"),
        ("__device__ void apply_rows(const BatchNormActForwardArgs& a) {\n",
         "__device__ void apply_rows(const BatchNormActForwardArgs& a, bool probe_cache_on = false) {\n"),
        ("    auto add = [&](const P& p) {\n",
         CACHE_DECLARATIONS.replace("\n  ", "\n    ").replace("  extern", "    extern", 1) +
         "    int probe_k = 0;  // the rows added so far: row0 + probe_k * step is the next\n"
         "    auto add = [&](const P& p) {\n"
         "      if (probe_caching && probe_k < PROBE_CACHE_ROWS) probe_cache[probe_k * probe_threads] = p;\n"
         "      ++probe_k;\n"),
        ("  const int64_t column = group * V;\n  float mean[V], invstd[V], weight[V], bias[V];\n",
         CACHE_DECLARATIONS + "  const int64_t column = group * V;\n  float mean[V], invstd[V], weight[V], bias[V];\n"),
        ("      x_p[u] = *reinterpret_cast<const P*>(x + offset);",
         "      x_p[u] = probe_caching && k - u < PROBE_CACHE_ROWS ? probe_cache[(k - u) * probe_threads]\n"
         "                                                          : *reinterpret_cast<const P*>(x + offset);"),
        ("    process(*reinterpret_cast<const P*>(x + offset), r_p, offset);",
         "    process(probe_caching && k < PROBE_CACHE_ROWS ? probe_cache[k * probe_threads]\n"
         "                                                  : *reinterpret_cast<const P*>(x + offset), r_p, offset);"),
        ("    return std::max<size_t>(statistics_floats(V, threads), kFinalizeFloats);\n",
         "    return std::max<size_t>(statistics_floats(V, threads), kFinalizeFloats) +\n"
         "           (static_cast<size_t>(PROBE_CACHE_ROWS) * threads * sizeof(Pack<T, V>) + 3) / 4;\n"),
        ("  const auto kernel = batch_norm_act_forward_one_launch<T, V, kResidual, kAct>;\n",
         "  const auto kernel = batch_norm_act_forward_one_launch<T, V, kResidual, kAct>;\n"
         "  if (PROBE_CACHE_ROWS > 0) {  // over 48 KB of dynamic shared memory: asked for, a refusal fatal\n"
         "    const cudaError_t room = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,\n"
         "        static_cast<int>(shared_floats(nhwc::kThreads) * sizeof(float)));\n"
         "    if (room != cudaSuccess) return room;\n"
         "  }\n"),
    ]
    for old, new in replacements:
        count = source.count(old)
        if count != 1:
            raise SystemExit(f"batch_norm_forward_phases: the kernel has changed: {count} places match the patch "
                             f"that starts {old.strip().splitlines()[0]!r} (expected 1); update the probe")
        source = source.replace(old, new)
    return source


def nvcc() -> str:
    """The nvcc of the toolkit the package's build takes (_build_paths.cuda_home: CUDA_HOME, torch's guess,
    /usr/local/cuda-<torch's CUDA>, /usr/local/cuda)."""
    import torch
    from torch.utils import cpp_extension

    from torch_cudnn_fusion._build_paths import cuda_home

    home = cuda_home(cpp_extension.CUDA_HOME, torch.version.cuda)
    if home is None:
        raise SystemExit("batch_norm_forward_phases: no CUDA toolkit found (set CUDA_HOME)")
    return str(home / "bin" / "nvcc")


def build(work: Path, name: str, flags: list[str]) -> Path:
    binary = work / name.replace(" ", "_")
    command = [nvcc(), "-std=c++17", "-O3", "-gencode=arch=compute_90,code=sm_90", *flags,
               f"-I{HERE.parent / 'csrc'}", f"-I{work}", str(work / "batch_norm_forward_phases.cu"), "-o", str(binary)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"batch_norm_forward_phases: nvcc failed for {name}:\n{done.stderr[-3000:]}")
    return binary


# The blocks' stamps in a row (µs from the earliest block's start; 0 where the variant runs three launches): the
# latest start, the median and latest end of the statistics pass, the earliest, median and latest exit from barrier 2,
# the median and latest end. The apply pass's time in the table runs from block (0, 0)'s exit from barrier 2 to the
# latest end: these show how much of it is the blocks leaving the barrier apart.
BLOCK_FIELDS = ("latest start", "statistics end median", "statistics end latest", "barrier 2 exit earliest",
                "barrier 2 exit median", "barrier 2 exit latest", "end median", "end latest")


def parse(output: str, build_name: str) -> tuple[str, list[dict], dict]:
    """(device, rows, {"<channels>@<size>": hash of the reference's bits})"""
    device, rows, bits = "", [], {}
    for line in output.splitlines():
        fields = line.split(",")
        if fields[0] == "device":
            device = f"{fields[1]} ({fields[2]} multiprocessors)"
        elif fields[0] == "bits":
            bits[f"{fields[1]}@{fields[2]}"] = fields[3]
        elif fields[0] == "row":
            numbers = [float(f) for f in fields[5:]]
            rows.append({"build": build_name, "channels": int(fields[1]), "size": int(fields[2]),
                         "activation": "relu6" if fields[3] == "2" else "none", "variant": fields[4],
                         "graph_us": numbers[0], "issued_us": numbers[1], "copy_us": numbers[2],
                         "grid": [int(numbers[3]), int(numbers[4])], "block": [int(numbers[5]), int(numbers[6])],
                         "max_difference": numbers[7],
                         "phases_us": dict(zip(("statistics", "barrier 1", "finalize", "barrier 2", "apply"),
                                               numbers[8:13])),
                         "blocks_us": dict(zip(BLOCK_FIELDS, numbers[13:13 + len(BLOCK_FIELDS)]))})
    return device, rows, bits


def same_bits(bits: dict, other: dict, other_name: str) -> str:
    """Which shapes' reference bits (hashes by "<channels>@<size>") are as in `other`'s, in words."""
    same = [shape for shape in bits if other.get(shape) == bits[shape]]
    return (f"the reference's bits (y, saved mean and invstd) as {other_name}'s on {len(same)} of {len(bits)} shapes"
            + "".join(f"; differ: {shape}" for shape in bits if shape not in same))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--keep", default=None, help="write the patched sources and binaries here (default: a temp dir)")
    p.add_argument("--kernel", default=str(KERNEL), help="the kernel's source to probe (another version of it, for "
                   "an A/B)")
    p.add_argument("--builds", nargs="+", choices=[name for name, _ in BUILDS], default=None,
                   help="the builds to run (default: all)")
    p.add_argument("--bits-of", default=None, help="a --json of another run (another version of the kernel): say on "
                   "which shapes the reference's bits (y, saved mean and invstd) are the same")
    args = p.parse_args()
    builds = [b for b in BUILDS if args.builds is None or b[0] in args.builds]
    work = Path(args.keep or tempfile.mkdtemp(prefix="bn_forward_phases_"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "bnf_patched.cu").write_text(patched_kernel(Path(args.kernel).read_text()))
    shutil.copy(HERE / "batch_norm_forward_phases.cu", work / "batch_norm_forward_phases.cu")
    with concurrent.futures.ThreadPoolExecutor(len(builds)) as pool:
        binaries = list(pool.map(lambda b: build(work, *b), builds))
    device, rows, bits_of_builds = "", [], {}
    for (name, _), binary in zip(builds, binaries):
        done = subprocess.run([str(binary)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"batch_norm_forward_phases: {name} failed: {done.stderr[-2000:]}")
        device, found, found_bits = parse(done.stdout, name)
        rows += found
        bits_of_builds[name] = found_bits
    print(f"our BatchNorm forward kernel on {device}: us a launch (CUDA-graph replay), batch 256, bfloat16, NHWC; "
          "phases: block (0, 0)'s view of the one launch, apply to the latest block's end; max |dy|: y against the "
          "reference (three launches, two blocks a multiprocessor)")
    print(f"{'build':<19}{'shape':<16}{'variant':<19}{'us':>7}{'issued':>8}{'copy':>7}{'grid':>10}"
          f"{'stats':>7}{'bar1':>6}{'final':>7}{'bar2':>6}{'apply':>7}{'max |dy|':>10}")
    for r in rows:
        shape = f"{r['channels']}@{r['size']}x{r['size']} {r['activation']}"
        phases = "".join(f"{v:>{w}.2f}" for v, w in zip(r["phases_us"].values(), (7, 6, 7, 6, 7)))
        print(f"{r['build']:<19}{shape:<16}{r['variant']:<19}{r['graph_us']:>7.2f}{r['issued_us']:>8.2f}"
              f"{r['copy_us']:>7.2f}{r['grid'][0]:>4}x{r['grid'][1]:<5}{phases}{r['max_difference']:>10.3g}")
    print("\nthe blocks of the one launch, us from the earliest block's start: " + ", ".join(BLOCK_FIELDS))
    for r in rows:
        if r["variant"] in ("main", "2 blocks/SM", "1 block/SM") and any(r["blocks_us"].values()):
            shape = f"{r['channels']}@{r['size']}x{r['size']} {r['activation']}"
            print(f"{r['build']:<19}{shape:<16}{r['variant']:<19}"
                  + "".join(f"{value:>8.2f}" for value in r["blocks_us"].values()))
    bits = bits_of_builds[builds[0][0]]
    for name, other in bits_of_builds.items():  # the builds change the loads' order, not the arithmetic's
        if other != bits:
            print(f"build {name}: {same_bits(other, bits, builds[0][0])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "kernel": args.kernel, "bits": bits, "rows": rows}, f, indent=1)
    if args.bits_of:
        run = json.loads(Path(args.bits_of).read_text())
        if "bits" not in run:
            raise SystemExit(f"batch_norm_forward_phases: {args.bits_of} holds no reference bits (a run before they "
                             "were hashed)")
        print(f"this kernel: {same_bits(bits, run['bits'], args.bits_of)}")


if __name__ == "__main__":
    main()
