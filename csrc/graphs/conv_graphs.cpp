// The conv graphs (forward with bias, residual and ReLU; ReLU backward with the bias gradient; dgrad; wgrad) as
// frontend descriptions, and their cache keys.
#include "graphs/conv_graphs.h"

#include "graphs/graph_builder.h"

#include <ATen/ATen.h>

#include <cudnn.h>

#include "core/device.h"
#include "core/engine_policy.h"

namespace tcf {

fe::DataType_t fe_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return fe::DataType_t::HALF;
    case at::kBFloat16:
      return fe::DataType_t::BFLOAT16;
    case at::kFloat:
      return fe::DataType_t::FLOAT;
    default:
      TORCH_CHECK(false, "torch_cudnn_fusion: dtype must be float16, bfloat16 or float32, got ", dtype);
  }
}

std::vector<int64_t> as_vector(const std::array<int64_t, 4>& a) { return {a.begin(), a.end()}; }
std::vector<int64_t> as_vector(const std::array<int64_t, 2>& a) { return {a.begin(), a.end()}; }

TensorPtr add_tensor(fe::graph::Graph& graph, const char* name, int64_t uid, const std::array<int64_t, 4>& size,
                     bool channels_last, fe::DataType_t dtype) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim(as_vector(size))
                          .set_stride(dense_strides(size, channels_last))
                          .set_data_type(dtype));
}

void mark_output(const TensorPtr& tensor, const char* name, int64_t uid, const std::array<int64_t, 4>& size,
                 bool channels_last, fe::DataType_t dtype) {
  tensor->set_output(true)
      .set_name(name)
      .set_uid(uid)
      .set_dim(as_vector(size))
      .set_stride(dense_strides(size, channels_last))
      .set_data_type(dtype);
}

// Bias and its gradient: one value per output channel, shaped [1, K, 1, 1].
static std::array<int64_t, 4> channel_vector_size(int64_t channels) { return {1, channels, 1, 1}; }

std::shared_ptr<RunnableGraph> new_graph(const GraphKey& key) {
  auto graph = std::make_shared<RunnableGraph>();
  graph->set_io_data_type(fe_dtype(static_cast<at::ScalarType>(key.dtype)))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

namespace {

template <typename Attributes>
Attributes conv_attributes(const ConvShape& shape, Attributes attributes) {
  return attributes.set_pre_padding(as_vector(shape.pad_pre))
      .set_post_padding(as_vector(shape.pad_post))
      .set_stride(as_vector(shape.stride))
      .set_dilation(as_vector(shape.dilation))
      .set_compute_data_type(fe::DataType_t::FLOAT);
}

}  // namespace

void describe_conv_bias_act(fe::graph::Graph& graph, const GraphKey& key) {
  const auto& shape = key.conv();
  auto io = fe_dtype(static_cast<at::ScalarType>(key.dtype));
  auto x = add_tensor(graph, "x", kUidX, shape.x_size, key.channels_last, io);
  auto w = add_tensor(graph, "w", kUidW, shape.w_size, key.channels_last, io);
  auto y = graph.conv_fprop(x, w, conv_attributes(shape, fe::graph::Conv_fprop_attributes().set_name("conv")));
  if (shape.has_bias) {
    auto bias = add_tensor(graph, "bias", kUidBias, channel_vector_size(shape.w_size[0]), true, io);
    y = graph.pointwise(y, bias, fe::graph::Pointwise_attributes().set_name("add_bias").set_mode(fe::PointwiseMode_t::ADD));
  }
  if (shape.has_residual) {
    auto residual = add_tensor(graph, "residual", kUidResidual, shape.y_size(), key.channels_last, io);
    y = graph.pointwise(y, residual,
                        fe::graph::Pointwise_attributes().set_name("add_residual").set_mode(fe::PointwiseMode_t::ADD));
  }
  if (shape.activation == Activation::kRelu || shape.activation == Activation::kRelu6) {
    y = graph.pointwise(y, fe::graph::Pointwise_attributes().set_name("relu").set_mode(fe::PointwiseMode_t::RELU_FWD));
  }
  if (shape.activation == Activation::kRelu6) {  // ReLU's upper clip: refused by every engine; a min with 6: taken
    auto six = graph.tensor(6.0f);
    y = graph.pointwise(y, six, fe::graph::Pointwise_attributes().set_name("min_6").set_mode(fe::PointwiseMode_t::MIN)
                                    .set_compute_data_type(fe::DataType_t::FLOAT));
  }
  mark_output(y, "y", kUidY, shape.y_size(), key.channels_last, io);
}

void describe_relu_bias_backward(fe::graph::Graph& graph, const GraphKey& key) {
  const auto& y_size = key.relu_bias().y_size;
  auto io = fe_dtype(static_cast<at::ScalarType>(key.dtype));
  auto dy = add_tensor(graph, "dy", kUidDy, y_size, key.channels_last, io);
  // The mask comes from the saved forward output: y > 0 exactly where the pre-activation was > 0.
  auto y = add_tensor(graph, "y", kUidY, y_size, key.channels_last, io);
  auto dz = graph.pointwise(dy, y, fe::graph::Pointwise_attributes().set_name("relu_backward").set_mode(fe::PointwiseMode_t::RELU_BWD));
  mark_output(dz, "dz", kUidDz, y_size, key.channels_last, io);
  auto dbias = graph.reduction(dz, fe::graph::Reduction_attributes()
                                       .set_name("bias_grad")
                                       .set_mode(fe::ReductionMode_t::ADD)
                                       .set_compute_data_type(fe::DataType_t::FLOAT));
  mark_output(dbias, "dbias", kUidDbias, channel_vector_size(y_size[1]), true, fe::DataType_t::FLOAT);
}

void describe_dgrad(fe::graph::Graph& graph, const GraphKey& key) {
  const auto& shape = key.conv();
  auto io = fe_dtype(static_cast<at::ScalarType>(key.dtype));
  auto dz = add_tensor(graph, "dz", kUidDz, shape.y_size(), key.channels_last, io);
  auto w = add_tensor(graph, "w", kUidW, shape.w_size, key.channels_last, io);
  auto dx = graph.conv_dgrad(dz, w, conv_attributes(shape, fe::graph::Conv_dgrad_attributes().set_name("dgrad")));
  mark_output(dx, "dx", kUidDx, shape.x_size, key.channels_last, io);
}

void describe_wgrad(fe::graph::Graph& graph, const GraphKey& key) {
  const auto& shape = key.conv();
  auto io = fe_dtype(static_cast<at::ScalarType>(key.dtype));
  auto dz = add_tensor(graph, "dz", kUidDz, shape.y_size(), key.channels_last, io);
  auto x = add_tensor(graph, "x", kUidX, shape.x_size, key.channels_last, io);
  auto dw = graph.conv_wgrad(dz, x, conv_attributes(shape, fe::graph::Conv_wgrad_attributes().set_name("wgrad")));
  mark_output(dw, "dw", kUidDw, shape.w_size, key.channels_last, io);
}


void check_conv_problem(const ConvProblem& p) {
  auto at_least = [](const std::array<int64_t, 2>& values, int64_t min_value, const char* name) {
    TORCH_CHECK_VALUE(values[0] >= min_value && values[1] >= min_value, "cudnn_fusion: ", name,
                      " values must be >= ", min_value, ", got ", at::IntArrayRef(values));
  };
  at_least(p.stride, 1, "stride");
  at_least(p.dilation, 1, "dilation");
  at_least(p.pad_pre, 0, "padding (before)");
  at_least(p.pad_post, 0, "padding (after)");
  TORCH_CHECK_VALUE(p.groups >= 1, "cudnn_fusion: groups must be >= 1, got ", p.groups);
  TORCH_CHECK_VALUE(p.x_size[0] >= 0 && p.x_size[1] >= 1 && p.x_size[2] >= 1 && p.x_size[3] >= 1,
                    "cudnn_fusion: x's size must be [N >= 0, C >= 1, H >= 1, W >= 1], got ", at::IntArrayRef(p.x_size));
  TORCH_CHECK_VALUE(p.w_size[0] >= 1 && p.w_size[1] >= 1 && p.w_size[2] >= 1 && p.w_size[3] >= 1,
                    "cudnn_fusion: weight's size must be positive, got ", at::IntArrayRef(p.w_size));
  TORCH_CHECK_VALUE(p.x_size[1] == p.w_size[1] * p.groups, "cudnn_fusion: x has ", p.x_size[1],
                    " channels but weight of shape ", at::IntArrayRef(p.w_size), " with groups=", p.groups,
                    " expects ", p.w_size[1] * p.groups);
  TORCH_CHECK_VALUE(p.w_size[0] % p.groups == 0, "cudnn_fusion: weight's out_channels (", p.w_size[0],
                    ") must be divisible by groups (", p.groups, ")");
  for (int i = 0; i < 2; ++i) {
    int64_t extent = p.x_size[2 + i] + p.pad_pre[i] + p.pad_post[i];
    int64_t window = p.dilation[i] * (p.w_size[2 + i] - 1) + 1;
    TORCH_CHECK_VALUE(extent >= window, "cudnn_fusion: the padded input (", (i ? "width " : "height "), extent,
                      ") is smaller than the dilated kernel (", window, ")");
  }
}


std::vector<int64_t> dense_strides(const std::array<int64_t, 4>& size, bool channels_last) {
  const int64_t n = size[0], c = size[1], h = size[2], w = size[3];
  (void)n;
  if (channels_last) return {c * h * w, 1, w * c, c};
  return {c * h * w, h * w, w, 1};
}

GraphKey key_common(GraphKind kind, at::ScalarType dtype, bool channels_last, int device, int64_t policy,
                    const std::array<int8_t, 5>& alignment) {
  GraphKey key;
  key.kind = kind;
  key.device = static_cast<int8_t>(device);
  auto cc = compute_capability(device);
  key.cc_major = cc.major;
  key.cc_minor = cc.minor;
  static const int64_t cudnn_version = static_cast<int64_t>(cudnnGetVersion());
  key.cudnn_version = cudnn_version;
  key.dtype = static_cast<int8_t>(dtype);
  key.channels_last = channels_last;
  key.alignment = alignment;
  key.policy = policy_for(policy, kind);
  return key;
}

GraphKey make_relu_bias_key(at::ScalarType dtype, bool channels_last, int device, const std::array<int64_t, 4>& y_size,
                            int64_t policy, const std::array<int8_t, 5>& alignment) {
  auto key = key_common(GraphKind::kReluBiasBackward, dtype, channels_last, device, policy, alignment);
  key.allow_tf32 = dtype == at::kFloat && at::globalContext().allowTF32CuDNN();
  key.shape = ReluBiasShape{y_size};
  return key;
}

GraphKey make_graph_key(GraphKind kind, const ConvProblem& p, const std::array<int8_t, 5>& alignment) {
  if (kind == GraphKind::kReluBiasBackward) {
    return make_relu_bias_key(p.dtype, p.channels_last, p.device, p.y_size(), p.policy, alignment);
  }
  auto key = key_common(kind, p.dtype, p.channels_last, p.device, p.policy, alignment);
  key.allow_tf32 = p.dtype == at::kFloat && at::globalContext().allowTF32CuDNN();
  ConvShape shape = p;
  if (kind != GraphKind::kConvBiasAct) {  // dgrad and wgrad do not read the epilogue: it must not split their keys
    shape.has_bias = shape.has_residual = false;
    shape.activation = Activation::kNone;
  }
  key.shape = shape;
  return key;
}

}  // namespace tcf
