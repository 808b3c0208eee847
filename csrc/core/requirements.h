// Every requirement this library knows of for running a layer fused, stated once: the verdict asked before any
// plan is built (empty, or the unmet requirements), and the words that explain a refusal of cuDNN's.
#pragma once

#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "core/plan_cache.h"

namespace tcf {

// The unmet requirements of a conv layer (empty: it may be fused; cuDNN then decides). Two kinds:
// - cuDNN's: float32 engines need channel counts that are multiples of 4;
// - measured (lifted under the autotune policy, which times the layer's plans against ATen instead): grouped and
//   depthwise convolutions, and half-precision layers whose channel counts are not multiples of 8, ran slower
//   fused than in PyTorch's own kernels (docs/fallback_rules.md has the measurements). A stem's few input
//   channels (up to kStemChannels, an image's 3) are exempt: cuDNN pads them, and the stems measured ran faster
//   fused.
std::vector<std::string> conv_layer_verdict(at::ScalarType dtype, int64_t in_channels, int64_t out_channels,
                                            int64_t groups, bool autotune);
constexpr int64_t kStemChannels = 4;

// The unmet requirements of a BatchNorm layer in training (empty: it may be fused; cuDNN then decides): 4-D input,
// channels_last (cuDNN's BatchNorm kernels are NHWC), and more than one value per channel (batch statistics are
// undefined otherwise). A negative size is one not known yet (traced by torch.compile): its check is left to the
// run.
std::vector<std::string> batch_norm_layer_verdict(const std::vector<int64_t>& x_size, bool channels_last);

// The channel multiple cuDNN's fused engines want for `dtype` (4 for float32, 8 for float16 and bfloat16).
int64_t channel_multiple(at::ScalarType dtype);

// "x [...], w [...], dtype, layout, groups, sm_XY, cuDNN N": the configuration a key describes, for messages.
std::string describe_problem(const GraphKey& key);

// The requirements of cuDNN's fused (runtime fusion) engines that a refused key does not meet (layout, channel and
// pointer alignment, compute capability, TF32, policy limits), so that a refusal names what to change.
std::vector<std::string> unmet_requirements(const GraphKey& key);

// cuDNN's message for a refused graph, condensed: it lists every engine tried, each with the same chain of generic
// lines (about 10 KB for one conv layer); kept are its first line and the distinct specific reasons (at most six,
// e.g. "(act.mode != CUDNN_ACTIVATION_IDENTITY) && (act.mode != CUDNN_ACTIVATION_RELU)"). One-line messages as given.
std::string condense_cudnn_message(const std::string& message);

// "cuDNN refused the <graph> graph (<configuration>) at <stage>: <message, condensed>. Requirements not met: [...]".
std::string describe_refusal(const GraphKey& key, const std::string& stage, const std::string& message);

}  // namespace tcf
