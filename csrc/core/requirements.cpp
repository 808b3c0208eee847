#include "core/requirements.h"

#include <algorithm>
#include <sstream>

#include <c10/core/ScalarType.h>

namespace tcf {

int64_t channel_multiple(at::ScalarType dtype) { return dtype == at::kFloat ? 4 : 8; }

std::vector<std::string> conv_layer_verdict(at::ScalarType dtype, int64_t in_channels, int64_t out_channels,
                                            int64_t groups, bool autotune) {
  std::vector<std::string> unmet;
  auto channels = [&]() {
    std::ostringstream out;
    out << "in_channels=" << in_channels << ", out_channels=" << out_channels << ": ";
    return out.str();
  };
  if (dtype == at::kFloat && (in_channels % 4 != 0 || out_channels % 4 != 0)) {
    unmet.push_back(channels() + "cuDNN's fused float32 engines need multiples of 4");
  }
  if (autotune) return unmet;
  if (groups > 1) {
    std::ostringstream out;
    out << "groups=" << groups << ": grouped and depthwise convolutions run PyTorch's own kernel, which was faster "
        << "than cuDNN's fused grouped engines (EnginePolicy('autotune') times both)";
    unmet.insert(unmet.begin(), out.str());
  }
  bool odd_in = in_channels % 8 != 0 && in_channels > kStemChannels;
  if (dtype != at::kFloat && (odd_in || out_channels % 8 != 0)) {
    unmet.push_back(channels() + "not both multiples of 8; for " + std::string(c10::toString(dtype)) +
                    " such layers ran slower fused than eager, so eager is used (EnginePolicy('autotune') times it "
                    "instead)");
  }
  return unmet;
}

namespace {

std::ostream& operator<<(std::ostream& out, const std::array<int64_t, 4>& size) {
  return out << "[" << size[0] << ", " << size[1] << ", " << size[2] << ", " << size[3] << "]";
}

// The shape's part of describe_problem, one overload per family.
void describe_shape(std::ostream& out, const ConvShape& s) {
  out << "x " << s.x_size << ", w " << s.w_size << ", groups " << s.groups;
}
void describe_shape(std::ostream& out, const ReluBiasShape& s) { out << "y " << s.y_size; }
void describe_shape(std::ostream& out, const BatchNormShape& s) { out << "x " << s.x_size; }

// Input channels per group and output channels per group of the graph's main operation.
std::array<int64_t, 2> channels_per_group(const GraphKey& key) {
  if (const auto* conv = std::get_if<ConvShape>(&key.shape)) {
    return {conv->w_size[1], conv->w_size[0] / conv->groups};
  }
  if (const auto* relu_bias = std::get_if<ReluBiasShape>(&key.shape)) {
    return {relu_bias->y_size[1], relu_bias->y_size[1]};
  }
  const auto& batch_norm = key.batch_norm();
  return {batch_norm.x_size[1], batch_norm.x_size[1]};
}

}  // namespace

std::vector<std::string> batch_norm_layer_verdict(const std::vector<int64_t>& x_size, bool channels_last) {
  if (x_size.size() != 4) {
    return {"x is " + std::to_string(x_size.size()) + "-D: the fused BatchNorm takes 4-D [N, C, H, W] input"};
  }
  std::vector<std::string> unmet;
  if (!channels_last) {
    unmet.push_back("x is not channels_last: cuDNN's fused BatchNorm kernels are NHWC (use "
                    "x.to(memory_format=torch.channels_last))");
  }
  if (x_size[1] == 0) {
    unmet.push_back("x has no channels: nothing to normalize (eager's BatchNorm decides what that gives)");
  }
  bool known = x_size[0] >= 0 && x_size[2] >= 0 && x_size[3] >= 0;
  if (known && x_size[0] * x_size[2] * x_size[3] <= 1) {
    unmet.push_back("one value per channel: batch statistics are undefined (eager raises the error)");
  }
  return unmet;
}

std::string describe_problem(const GraphKey& key) {
  std::ostringstream out;
  std::visit([&out](const auto& shape) { describe_shape(out, shape); }, key.shape);
  out << ", " << static_cast<at::ScalarType>(key.dtype) << ", " << (key.channels_last ? "NHWC" : "NCHW") << ", sm_"
      << int(key.cc_major) << int(key.cc_minor) << ", cuDNN " << key.cudnn_version;
  return out.str();
}

// The requirements of cuDNN's fused (runtime fusion) engines that this configuration does not meet, so that a
// refusal names what to change rather than a bare status.
std::vector<std::string> unmet_requirements(const GraphKey& key) {
  std::vector<std::string> unmet;
  auto dtype = static_cast<at::ScalarType>(key.dtype);
  if (!key.channels_last) {
    unmet.push_back("layout: tensors are NCHW; the fused engines want channels_last (NHWC)");
  }
  int64_t multiple = channel_multiple(dtype);
  auto [c_per_group, k_per_group] = channels_per_group(key);
  if (c_per_group % multiple != 0 || k_per_group % multiple != 0) {
    std::ostringstream msg;
    msg << "channel alignment: input channels per group (" << c_per_group << ") and output channels per group ("
        << k_per_group << ") must be multiples of " << multiple << " for " << dtype;
    unmet.push_back(msg.str());
  }
  for (size_t i = 0; i < key.alignment.size(); ++i) {
    if (key.alignment[i] != 0 && key.alignment[i] < 16) {
      std::ostringstream msg;
      msg << "pointer alignment: operand " << i << " of the graph is " << int(key.alignment[i])
          << "-byte aligned; the vectorized engines need 16";
      unmet.push_back(msg.str());
      break;
    }
  }
  int min_major = dtype == at::kBFloat16 ? 8 : 7;
  if (key.cc_major < min_major) {
    std::ostringstream msg;
    msg << "compute capability: sm_" << int(key.cc_major) << int(key.cc_minor) << " is below sm_" << min_major
        << "0, the oldest GPU with fused engines for " << dtype;
    unmet.push_back(msg.str());
  }
  const auto* conv = std::get_if<ConvShape>(&key.shape);
  if (dtype == at::kFloat && !key.allow_tf32 && !std::holds_alternative<BatchNormShape>(key.shape)) {
    unmet.push_back("math: float32 with torch.backends.cudnn.allow_tf32=False excludes every tensor-core engine");
  }
  if (conv != nullptr && conv->groups > 1) unmet.push_back("groups: grouped convolutions have few fused engines");
  if (key.policy.deterministic) {
    unmet.push_back("policy: deterministic (or torch.use_deterministic_algorithms) excludes every engine with "
                    "cuDNN's NONDETERMINISTIC note");
  }
  if (key.policy.workspace_limit >= 0) {
    std::ostringstream msg;
    msg << "policy: workspace limit " << key.policy.workspace_limit << " bytes excludes engines that need more";
    unmet.push_back(msg.str());
  }
  return unmet;
}

namespace {

// The lines cuDNN repeats under every engine it tried, which say nothing about why.
bool generic_reason(const std::string& reason) {
  static const char* const kGeneric[] = {"finalize_internal()", "engine.finalize()", "status", "core_engine.getStatus()",
                                         "engine_iface->getStatus()", "ptr->isSupported()",
                                         "core_engine.isSupported()"};
  for (const char* generic : kGeneric) {
    if (reason == generic) return true;
  }
  return reason.find("CUDNN_STATUS_NOT_INITIALIZED == status") != std::string::npos ||
         reason.find("global index -1") != std::string::npos;
}

}  // namespace

std::string condense_cudnn_message(const std::string& message) {
  if (message.find('\n') == std::string::npos) return message;
  std::istringstream lines(message);
  std::string line, first;
  std::vector<std::string> reasons;
  constexpr size_t kMaxReasons = 6;
  while (std::getline(lines, line)) {
    auto at = line.find("Reason: ");
    if (at == std::string::npos) {
      if (first.empty() && !line.empty() && line[0] != '{') first = line;
      continue;
    }
    auto reason = line.substr(at + 8);
    if (generic_reason(reason) || reasons.size() == kMaxReasons) continue;
    if (std::find(reasons.begin(), reasons.end(), reason) == reasons.end()) reasons.push_back(reason);
  }
  if (reasons.empty()) return first.empty() ? message : first;
  std::string out = first + " (the engines' reasons: ";
  for (size_t i = 0; i < reasons.size(); ++i) out += (i ? "; " : "") + reasons[i];
  return out + ")";
}

std::string describe_refusal(const GraphKey& key, const std::string& stage, const std::string& message) {
  std::ostringstream out;
  out << "cuDNN refused the " << graph_kind_name(key.kind) << " graph (" << describe_problem(key) << ") at "
      << stage << ": " << condense_cudnn_message(message);
  auto unmet = unmet_requirements(key);
  if (unmet.empty()) {
    out << ". The configuration meets every requirement this library knows of (NHWC, channel and pointer "
           "alignment, compute capability, TF32); cuDNN gave no further reason";
  } else {
    out << ". Requirements not met:";
    for (const auto& requirement : unmet) out << " [" << requirement << "]";
  }
  return out.str();
}

}  // namespace tcf
