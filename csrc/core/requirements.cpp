#include "core/requirements.h"

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

std::string describe_problem(const GraphKey& key) {
  std::ostringstream out;
  if (key.kind == GraphKind::kBatchNormForward || key.kind == GraphKind::kBatchNormBackward) {
    out << "x [" << key.x_size[0] << ", " << key.x_size[1] << ", " << key.x_size[2] << ", " << key.x_size[3] << "], "
        << static_cast<at::ScalarType>(key.dtype) << ", " << (key.channels_last ? "NHWC" : "NCHW") << ", sm_"
        << int(key.cc_major) << int(key.cc_minor) << ", cuDNN " << key.cudnn_version;
    return out.str();
  }
  out << "x [" << key.x_size[0] << ", " << key.x_size[1] << ", " << key.x_size[2] << ", " << key.x_size[3]
      << "], w [" << key.w_size[0] << ", " << key.w_size[1] << ", " << key.w_size[2] << ", " << key.w_size[3]
      << "], " << static_cast<at::ScalarType>(key.dtype) << ", " << (key.channels_last ? "NHWC" : "NCHW")
      << ", groups " << key.groups << ", sm_" << int(key.cc_major) << int(key.cc_minor) << ", cuDNN "
      << key.cudnn_version;
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
  // The relu backward graph has no input channels of its own (its key describes a 1x1 conv K -> K).
  int64_t c_per_group = key.kind == GraphKind::kReluBiasBackward ? key.w_size[0] : key.w_size[1];
  int64_t k_per_group = key.w_size[0] / key.groups;
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
  bool batch_norm = key.kind == GraphKind::kBatchNormForward || key.kind == GraphKind::kBatchNormBackward;
  if (dtype == at::kFloat && !key.allow_tf32 && !batch_norm) {
    unmet.push_back("math: float32 with torch.backends.cudnn.allow_tf32=False excludes every tensor-core engine");
  }
  if (key.groups > 1) unmet.push_back("groups: grouped convolutions have few fused engines");
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

std::string describe_refusal(const GraphKey& key, const std::string& stage, const std::string& message) {
  std::ostringstream out;
  out << "cuDNN refused the " << graph_kind_name(key.kind) << " graph (" << describe_problem(key) << ") at "
      << stage << ": " << message;
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
