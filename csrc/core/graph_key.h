// What a cached plan is keyed by: the parts every graph shares (device, cuDNN, dtype, layout, math, pointer
// alignment, engine policy) and one shape type per graph family, holding only the fields that family's graphs read.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <variant>

namespace tcf {

// Which graph a key describes. Each kind is described by one function (graphs/graph_builder.h).
enum class GraphKind : int8_t {
  kConvBiasAct = 0,      // conv_fprop -> (+ bias) -> (+ residual) -> (ReLU)
  kReluBiasBackward = 1, // dz = relu_backward(dy, y); dbias = sum(dz) over N, H, W
  kConvDgrad = 2,        // dx = conv_dgrad(dz, w)
  kConvWgrad = 3,        // dw = conv_wgrad(dz, x)
  kBatchNormForward = 4, // batchnorm (batch statistics, running statistics update) -> (+ residual) -> (ReLU / ReLU6)
  kBatchNormBackward = 5,  // dx, dscale, dbias = batchnorm_backward(dy, x, scale, saved mean and inverse std)
};
constexpr int64_t kGraphKinds = 6;

// "conv dgrad", "batchnorm forward", ...: the graph's name in messages.
const char* graph_kind_name(GraphKind kind);
// "forward", "relu_bias_backward", "dgrad", "wgrad", "batchnorm_forward", "batchnorm_backward": the names policies
// (EnginePolicy's engines) and the engine listing use.
const char* graph_short_name(GraphKind kind);

// The activation after a BatchNorm or a conv (and its backward). The conv ops take kNone, kRelu and kRelu6; the
// BatchNorm ops take all six (LeakyReLU with its negative slope, an argument of its own).
enum class Activation : int64_t { kNone = 0, kRelu = 1, kRelu6 = 2, kSilu = 3, kHardswish = 4, kLeakyRelu = 5 };

// SiLU, Hardswish and LeakyReLU are in no cuDNN graph and no legacy BatchNorm call (cuDNN 9.19 refuses SiLU's backward
// before the BatchNorm backward, and has no hardswish mode): the BatchNorm ops apply them to the output in place and
// fold their backward into our NHWC kernel. A BatchNorm problem (plan key, legacy descriptors) carries the activation
// its cuDNN call runs: graph_activation's.
inline bool applied_after_cudnn(Activation a) {
  return a == Activation::kSilu || a == Activation::kHardswish || a == Activation::kLeakyRelu;
}
inline Activation graph_activation(Activation a) { return applied_after_cudnn(a) ? Activation::kNone : a; }

// How a plan is chosen among the candidates cuDNN's heuristics offer (torch_cudnn_fusion.EnginePolicy).
enum class PolicyMode : int8_t {
  kHeuristic = 0,  // the heuristic's first buildable candidate (with torch.backends.cudnn.benchmark: the fastest of
                   // its first benchmark_candidates, timed once)
  kAutotune = 1,   // every candidate timed once, and the ATen composition with them: the fastest runs
  kPinned = 2,     // the candidate the user named; an unknown name is an error listing the valid ones
};

// The engine policy for one graph of a layer: part of the plan cache key, since it changes the plan.
struct EnginePolicy {
  PolicyMode mode = PolicyMode::kHeuristic;
  bool deterministic = false;    // only engines without cuDNN's NONDETERMINISTIC note
  int64_t workspace_limit = -1;  // bytes; negative: no limit
  std::string pinned;            // kPinned: cuDNN's plan name ("eng4_k2=1...") or "#<index>" in the heuristic's list
  // Under torch.backends.cudnn.benchmark: how many of the heuristic's candidates are timed, and whether the ATen
  // composition is timed with them (torch_cudnn_fusion/policy.py sets both, and says why).
  int64_t benchmark_candidates = 1;
  bool aten_under_benchmark = false;

  auto tie() const {
    return std::tie(mode, deterministic, workspace_limit, pinned, benchmark_candidates, aten_under_benchmark);
  }
  bool operator==(const EnginePolicy& other) const { return tie() == other.tie(); }
};

// The conv graphs' shape (forward, dgrad, wgrad). Sizes are logical NCHW whatever the layout.
struct ConvShape {
  std::array<int64_t, 4> x_size{};  // N, C, H, W
  std::array<int64_t, 4> w_size{};  // K, C / groups, R, S
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> pad_pre{0, 0};
  std::array<int64_t, 2> pad_post{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
  // The forward's epilogue; false in dgrad and wgrad keys, which do not read it.
  bool has_bias = false;
  bool has_residual = false;
  Activation activation = Activation::kNone;

  std::array<int64_t, 4> y_size() const;
  auto tie() const {
    return std::tie(x_size, w_size, stride, pad_pre, pad_post, dilation, groups, has_bias, has_residual, activation);
  }
  bool operator==(const ConvShape& other) const { return tie() == other.tie(); }
};

// The ReLU-backward-with-bias-gradient graph's shape: elementwise over the conv's output y, reduced per channel.
struct ReluBiasShape {
  std::array<int64_t, 4> y_size{};  // N, K, H, W

  bool operator==(const ReluBiasShape& other) const { return y_size == other.y_size; }
};

// The BatchNorm graphs' shape.
struct BatchNormShape {
  std::array<int64_t, 4> x_size{};  // N, C, H, W
  // The forward's; false / kNone in backward keys, which do not read them.
  bool running_stats = false;
  bool has_residual = false;
  Activation activation = Activation::kNone;

  auto tie() const { return std::tie(x_size, running_stats, has_residual, activation); }
  bool operator==(const BatchNormShape& other) const { return tie() == other.tie(); }
};

// Every field that can change the plan, and nothing else (no data pointers: only their alignment).
struct GraphKey {
  GraphKind kind = GraphKind::kConvBiasAct;
  int8_t device = 0;
  int8_t cc_major = 0;
  int8_t cc_minor = 0;
  int64_t cudnn_version = 0;
  int8_t dtype = 0;                   // at::ScalarType of every operand (BatchNorm statistics: float32)
  bool channels_last = true;          // NHWC when true, NCHW otherwise
  bool allow_tf32 = false;            // float32 conv and ReLU-backward graphs: TF32 engines allowed; else false
  std::array<int8_t, 5> alignment{};  // bytes (1..16) of each operand's data pointer, in the order the kind reads
                                      // them; 0 for slots the kind does not have
  EnginePolicy policy;
  std::variant<ConvShape, ReluBiasShape, BatchNormShape> shape;  // the alternative of kind's family

  const ConvShape& conv() const { return std::get<ConvShape>(shape); }
  const ReluBiasShape& relu_bias() const { return std::get<ReluBiasShape>(shape); }
  const BatchNormShape& batch_norm() const { return std::get<BatchNormShape>(shape); }

  auto tie() const {
    return std::tie(kind, device, cc_major, cc_minor, cudnn_version, dtype, channels_last, allow_tf32, alignment,
                    policy, shape);
  }
  bool operator==(const GraphKey& other) const { return tie() == other.tie(); }
};

struct GraphKeyHash {
  size_t operator()(const GraphKey& key) const;
};

}  // namespace tcf
