"""The host cost of how a C++ autograd node keeps its arguments: nine entries of ctx->saved_data (as the conv op's node
kept stride, paddings, dilation, groups, activation, policy and two flags before) against one packed entry
(csrc/ops/saved_ints.h, as it keeps them now). Runs on the CPU, no GPU needed: each node's forward returns a 4-element
CPU tensor, so what is timed is the node's own bookkeeping. Builds a small extension with torch.utils.cpp_extension.

    python benchmarks/autograd_saved_data.py [--calls 20000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys

import torch
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import host_us  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SOURCE = r"""
#include <torch/extension.h>
#include "ops/saved_ints.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

variable_list gradients(AutogradContext* ctx) {
  return {ctx->needs_input_grad(0) ? at::empty({4}) : at::Tensor(),
          ctx->needs_input_grad(1) ? at::empty({4}) : at::Tensor(), at::Tensor()};
}

struct NineEntries : public torch::autograd::Function<NineEntries> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, at::IntArrayRef pair) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x, w});
    ctx->saved_data["stride"] = pair.vec();
    ctx->saved_data["padding_pre"] = pair.vec();
    ctx->saved_data["padding_post"] = pair.vec();
    ctx->saved_data["dilation"] = pair.vec();
    ctx->saved_data["groups"] = int64_t{1};
    ctx->saved_data["activation"] = int64_t{1};
    ctx->saved_data["policy"] = int64_t{0};
    ctx->saved_data["has_bias"] = true;
    ctx->saved_data["has_residual"] = false;
    return {at::empty({4})};
  }
  static variable_list backward(AutogradContext* ctx, variable_list) {
    auto saved = ctx->get_saved_variables();
    auto stride = ctx->saved_data["stride"].toIntVector();
    auto padding_pre = ctx->saved_data["padding_pre"].toIntVector();
    auto padding_post = ctx->saved_data["padding_post"].toIntVector();
    auto dilation = ctx->saved_data["dilation"].toIntVector();
    int64_t sum = ctx->saved_data["groups"].toInt() + ctx->saved_data["activation"].toInt() +
                  ctx->saved_data["policy"].toInt() + ctx->saved_data["has_bias"].toBool() +
                  ctx->saved_data["has_residual"].toBool();
    TORCH_CHECK(sum + stride[0] + padding_pre[0] + padding_post[0] + dilation[0] > 0);
    return gradients(ctx);
  }
};

struct OnePackedEntry : public torch::autograd::Function<OnePackedEntry> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, at::IntArrayRef pair) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x, w});
    tcf::SavedInts().add(pair).add(pair).add(pair).add(pair).add(1).add(1).add(0).add(true).add(false).save(ctx);
    return {at::empty({4})};
  }
  static variable_list backward(AutogradContext* ctx, variable_list) {
    auto saved = ctx->get_saved_variables();
    tcf::SavedIntsReader ints(ctx);
    auto stride = ints.next_list();
    auto padding_pre = ints.next_list();
    auto padding_post = ints.next_list();
    auto dilation = ints.next_list();
    int64_t sum = ints.next() + ints.next() + ints.next() + ints.next_bool() + ints.next_bool();
    TORCH_CHECK(sum + stride[0] + padding_pre[0] + padding_post[0] + dilation[0] > 0);
    return gradients(ctx);
  }
};

}  // namespace

at::Tensor nine_entries(const at::Tensor& x, const at::Tensor& w) {
  std::vector<int64_t> pair{1, 1};
  return NineEntries::apply(x, w, at::IntArrayRef(pair))[0];
}
at::Tensor one_packed_entry(const at::Tensor& x, const at::Tensor& w) {
  std::vector<int64_t> pair{1, 1};
  return OnePackedEntry::apply(x, w, at::IntArrayRef(pair))[0];
}
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    module = load_inline("tcf_saved_data_bench", cpp_sources=[SOURCE],
                         functions=["nine_entries", "one_packed_entry"],
                         extra_include_paths=[os.path.join(ROOT, "csrc")], extra_cflags=["-O2"])
    x = torch.randn(4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    ones = torch.ones(4)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"{args.calls} calls a forward sample, a quarter of that a forward + backward one, median of 3 samples a round")
    print(f"{'node keeps its arguments as':<30}{'forward us':>12}{'forward + backward us':>24}   (each: median over "
          f"{args.rounds} interleaved rounds; in brackets the fastest round)")
    rows = (("nine saved_data entries", module.nine_entries), ("one packed entry", module.one_packed_entry))
    forward = {name: [] for name, _ in rows}
    both = {name: [] for name, _ in rows}
    for _ in range(args.rounds):  # interleaved: this host's speed drifts between rounds
        for name, fn in rows:
            forward[name].append(host_us(lambda: fn(x, w), args.calls, repeats=3, warmup=100, cuda=False))
            both[name].append(host_us(lambda: fn(x, w).backward(ones), args.calls // 4, repeats=3, warmup=100, cuda=False))
    for name, _ in rows:
        print(f"{name:<30}{statistics.median(forward[name]):>7.2f} ({min(forward[name]):.2f})"
              f"{statistics.median(both[name]):>16.2f} ({min(both[name]):.2f})")

if __name__ == "__main__":
    main()
