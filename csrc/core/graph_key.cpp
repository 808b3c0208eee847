#include "core/graph_key.h"

#include <functional>

#include "core/device.h"

namespace tcf {

namespace {

// Per GraphKind, in its order: the name in messages, and the name policies and the engine listing use.
struct KindNames {
  const char* name;
  const char* short_name;
};
constexpr KindNames kKinds[kGraphKinds] = {
    {"conv_bias_act forward", "forward"},         {"relu_bias backward", "relu_bias_backward"},
    {"conv dgrad", "dgrad"},                      {"conv wgrad", "wgrad"},
    {"batchnorm forward", "batchnorm_forward"},   {"batchnorm backward", "batchnorm_backward"},
};

bool known(GraphKind kind) { return static_cast<int64_t>(kind) >= 0 && static_cast<int64_t>(kind) < kGraphKinds; }

}  // namespace

const char* graph_kind_name(GraphKind kind) { return known(kind) ? kKinds[static_cast<int>(kind)].name : "unknown graph"; }

const char* graph_short_name(GraphKind kind) {
  return known(kind) ? kKinds[static_cast<int>(kind)].short_name : "unknown";
}

std::array<int64_t, 4> ConvShape::y_size() const {
  return conv_output_size(x_size, w_size, stride, pad_pre, pad_post, dilation);
}

namespace {

inline void hash_combine(size_t& seed, int64_t value) {
  seed ^= std::hash<int64_t>{}(value) + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2);
}

template <typename T, size_t N>
inline void hash_combine(size_t& seed, const std::array<T, N>& values) {
  for (const auto& v : values) hash_combine(seed, static_cast<int64_t>(v));
}

void hash_shape(size_t& seed, const ConvShape& s) {
  hash_combine(seed, s.x_size);
  hash_combine(seed, s.w_size);
  hash_combine(seed, s.stride);
  hash_combine(seed, s.pad_pre);
  hash_combine(seed, s.pad_post);
  hash_combine(seed, s.dilation);
  hash_combine(seed, s.groups);
  hash_combine(seed, (static_cast<int64_t>(s.activation) << 2) | (s.has_bias << 1) | s.has_residual);
}

void hash_shape(size_t& seed, const ReluBiasShape& s) { hash_combine(seed, s.y_size); }

void hash_shape(size_t& seed, const BatchNormShape& s) {
  hash_combine(seed, s.x_size);
  hash_combine(seed, (static_cast<int64_t>(s.activation) << 2) | (s.running_stats << 1) | s.has_residual);
}

}  // namespace

size_t GraphKeyHash::operator()(const GraphKey& k) const {
  size_t seed = 0;
  hash_combine(seed, static_cast<int64_t>(k.kind));
  hash_combine(seed, k.device);
  hash_combine(seed, k.cc_major * 16 + k.cc_minor);
  hash_combine(seed, k.cudnn_version);
  hash_combine(seed, k.dtype);
  hash_combine(seed, (k.channels_last << 1) | k.allow_tf32);
  hash_combine(seed, k.alignment);
  hash_combine(seed, (static_cast<int64_t>(k.policy.mode) << 2) | (k.policy.deterministic << 1) |
                         k.policy.aten_under_benchmark);
  hash_combine(seed, k.policy.workspace_limit);
  hash_combine(seed, k.policy.benchmark_candidates);
  hash_combine(seed, static_cast<int64_t>(std::hash<std::string>{}(k.policy.pinned)));
  std::visit([&seed](const auto& shape) { hash_shape(seed, shape); }, k.shape);
  return seed;
}

}  // namespace tcf
