#include "graphs/bn_graphs.h"

#include "graphs/graph_builder.h"

namespace tcf {

namespace {

// Per-channel tensors (scale, shift, statistics): float32 [1, C, 1, 1].
std::array<int64_t, 4> per_channel(const GraphKey& key) { return {1, key.batch_norm().x_size[1], 1, 1}; }

TensorPtr add_per_channel(fe::graph::Graph& graph, const char* name, int64_t uid, const GraphKey& key) {
  return add_tensor(graph, name, uid, per_channel(key), true, fe::DataType_t::FLOAT);
}

void mark_per_channel(const TensorPtr& tensor, const char* name, int64_t uid, const GraphKey& key) {
  mark_output(tensor, name, uid, per_channel(key), true, fe::DataType_t::FLOAT);
}

// A float32 scalar read from host memory at execution (epsilon, momentum): one plan serves every value.
TensorPtr add_scalar(fe::graph::Graph& graph, const char* name, int64_t uid) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_is_pass_by_value(true)
                          .set_data_type(fe::DataType_t::FLOAT));
}

}  // namespace

GraphKey make_batch_norm_key(GraphKind kind, const BatchNormProblem& p, const std::array<int8_t, 3>& alignment) {
  auto key = key_common(kind, p.dtype, p.channels_last, p.device, p.policy, {alignment[0], alignment[1], alignment[2], 0, 0});
  BatchNormShape shape{p.x_size};
  if (kind == GraphKind::kBatchNormForward) {  // the backward key leaves them unset: they cannot split it
    shape.running_stats = p.running_stats;
    shape.has_residual = p.has_residual;
    shape.activation = p.activation;
  }
  key.shape = shape;
  return key;
}

void describe_batch_norm_forward(fe::graph::Graph& graph, const GraphKey& key) {
  const auto& shape = key.batch_norm();
  auto io = fe_dtype(static_cast<at::ScalarType>(key.dtype));
  auto x = add_tensor(graph, "x", kUidX, shape.x_size, key.channels_last, io);
  auto scale = add_per_channel(graph, "scale", kUidScale, key);
  auto shift = add_per_channel(graph, "shift", kUidShift, key);
  auto epsilon = add_scalar(graph, "epsilon", kUidEpsilon);
  auto attributes = fe::graph::Batchnorm_attributes().set_name("batchnorm").set_epsilon(epsilon);
  if (shape.running_stats) {
    auto running_mean = add_per_channel(graph, "running_mean", kUidRunningMeanIn, key);
    auto running_var = add_per_channel(graph, "running_var", kUidRunningVarIn, key);
    auto momentum = add_scalar(graph, "momentum", kUidMomentum);
    attributes.set_previous_running_stats(running_mean, running_var, momentum);
  }
  auto [y, mean, inv_std, next_mean, next_var] = graph.batchnorm(x, scale, shift, attributes);
  mark_per_channel(mean, "saved_mean", kUidSavedMean, key);
  mark_per_channel(inv_std, "saved_inv_std", kUidSavedInvStd, key);
  if (shape.running_stats) {
    mark_per_channel(next_mean, "next_running_mean", kUidRunningMeanOut, key);
    mark_per_channel(next_var, "next_running_var", kUidRunningVarOut, key);
  }
  if (shape.has_residual) {
    auto residual = add_tensor(graph, "residual", kUidResidual, shape.x_size, key.channels_last, io);
    y = graph.pointwise(y, residual,
                        fe::graph::Pointwise_attributes().set_name("add_residual").set_mode(fe::PointwiseMode_t::ADD));
  }
  if (shape.activation != Activation::kNone) {
    auto relu = fe::graph::Pointwise_attributes().set_name("relu").set_mode(fe::PointwiseMode_t::RELU_FWD);
    if (shape.activation == Activation::kRelu6) relu.set_relu_upper_clip(6.0f);
    y = graph.pointwise(y, relu);
  }
  mark_output(y, "y", kUidY, shape.x_size, key.channels_last, io);
}

void describe_batch_norm_backward(fe::graph::Graph& graph, const GraphKey& key) {
  const auto& shape = key.batch_norm();
  auto io = fe_dtype(static_cast<at::ScalarType>(key.dtype));
  auto dy = add_tensor(graph, "dy", kUidDy, shape.x_size, key.channels_last, io);
  auto x = add_tensor(graph, "x", kUidX, shape.x_size, key.channels_last, io);
  auto scale = add_per_channel(graph, "scale", kUidScale, key);
  auto mean = add_per_channel(graph, "saved_mean", kUidSavedMean, key);
  auto inv_std = add_per_channel(graph, "saved_inv_std", kUidSavedInvStd, key);
  auto [dx, dscale, dshift] = graph.batchnorm_backward(
      dy, x, scale,
      fe::graph::Batchnorm_backward_attributes().set_name("batchnorm_backward").set_saved_mean_and_inv_variance(mean, inv_std));
  mark_output(dx, "dx", kUidDx, shape.x_size, key.channels_last, io);
  mark_per_channel(dscale, "dscale", kUidDscale, key);
  mark_per_channel(dshift, "dshift", kUidDshift, key);
}

}  // namespace tcf
