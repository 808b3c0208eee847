// Engine listing: every candidate plan cuDNN's heuristics offer for one graph of a conv layer, with its engine
// name (engine id and knob choices), behaviour notes, workspace and, on request, its median time on random data.
#include "graphs/engine_listing.h"

#include "graphs/graph_builder.h"

#include "core/requirements.h"

#include <chrono>

#include <ATen/ATen.h>

#include <c10/core/DeviceGuard.h>

namespace tcf {
namespace {

at::Tensor random_tensor(const std::array<int64_t, 4>& size, bool channels_last, const at::TensorOptions& options) {
  auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  return at::randn(size, options).contiguous(format);
}

// Buffers of the graph's shapes, filled with random values (never zeros: they can run faster than real data),
// and the variant pack that points at them.
std::unordered_map<int64_t, void*> timing_buffers(GraphKind kind, const ConvProblem& p,
                                                  std::vector<at::Tensor>& keep_alive) {
  auto options = at::TensorOptions().dtype(p.dtype).device(at::Device(at::kCUDA, p.device));
  auto y_size = p.y_size();
  std::array<int64_t, 4> bias_size{1, p.w_size[0], 1, 1};
  auto add = [&](int64_t uid, const std::array<int64_t, 4>& size, const at::TensorOptions& opts,
                 std::unordered_map<int64_t, void*>& pack) {
    keep_alive.push_back(random_tensor(size, p.channels_last, opts));
    pack[uid] = keep_alive.back().data_ptr();
  };
  std::unordered_map<int64_t, void*> pack;
  switch (kind) {
    case GraphKind::kConvBiasAct:
      add(kUidX, p.x_size, options, pack);
      add(kUidW, p.w_size, options, pack);
      add(kUidY, y_size, options, pack);
      if (p.has_bias) add(kUidBias, bias_size, options, pack);
      if (p.has_residual) add(kUidResidual, y_size, options, pack);
      break;
    case GraphKind::kReluBiasBackward:
      add(kUidDy, y_size, options, pack);
      add(kUidY, y_size, options, pack);
      add(kUidDz, y_size, options, pack);
      add(kUidDbias, bias_size, options.dtype(at::kFloat), pack);
      break;
    case GraphKind::kConvDgrad:
      add(kUidDz, y_size, options, pack);
      add(kUidW, p.w_size, options, pack);
      add(kUidDx, p.x_size, options, pack);
      break;
    case GraphKind::kConvWgrad:
      add(kUidDz, y_size, options, pack);
      add(kUidX, p.x_size, options, pack);
      add(kUidDw, p.w_size, options, pack);
      break;
    case GraphKind::kBatchNormForward:
    case GraphKind::kBatchNormBackward:
      TORCH_CHECK(false, "cudnn_fusion: the engine listing covers the conv graphs only");
  }
  return pack;
}

std::string behaviour_note_name(fe::BehaviorNote_t note) {
  switch (note) {
    case fe::BehaviorNote_t::RUNTIME_COMPILATION:
      return "runtime_compilation";
    case fe::BehaviorNote_t::REQUIRES_FILTER_INT8x32_REORDER:
      return "requires_filter_int8x32_reorder";
    case fe::BehaviorNote_t::REQUIRES_BIAS_INT8x32_REORDER:
      return "requires_bias_int8x32_reorder";
    case fe::BehaviorNote_t::SUPPORTS_CUDA_GRAPH_NATIVE_API:
      return "supports_cuda_graph_native_api";
    case fe::BehaviorNote_t::CUBLASLT_DEPENDENCY:
      return "cublaslt_dependency";
    default:
      return "other";
  }
}

}  // namespace

EngineListing list_engines(GraphKind kind, const ConvProblem& problem, bool time, int repeats) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(problem.device)));
  const int8_t aligned = 16;  // the listing's own buffers are fresh allocations
  auto key = make_graph_key(kind, problem, {aligned, aligned, aligned, aligned, aligned});
  key.policy.mode = PolicyMode::kHeuristic;  // list every candidate, pinned or not (deterministic and workspace
  key.policy.pinned.clear();                 // limits still deselect)
  EngineListing listing;
  BuildFailure failure;
  auto graph = candidate_graph(key, failure);
  if (!graph) {
    listing.refusal = describe_refusal(key, failure.stage, failure.message);
    return listing;
  }
  std::vector<at::Tensor> keep_alive;
  std::unordered_map<int64_t, void*> pack;
  if (time) pack = timing_buffers(kind, problem, keep_alive);
  int64_t count = graph->get_execution_plan_count();
  for (int64_t index = 0; index < count; ++index) {
    EngineCandidate candidate;
    candidate.index = index;
    const auto start = std::chrono::steady_clock::now();
    auto built = graph->build_plan_at_index(index);
    candidate.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (built.is_bad()) {
      candidate.error = built.get_message();
    } else {
      if (graph->get_plan_name_at_index(index, candidate.name).is_bad()) candidate.name = "unknown";
      candidate.workspace_bytes = graph->get_workspace_size_plan_at_index(index);
      std::vector<fe::BehaviorNote_t> notes;
      if (graph->get_behavior_notes_for_plan_at_index(index, notes).is_good()) {
        for (auto note : notes) candidate.behaviour_notes.push_back(behaviour_note_name(note));
      }
      if (listing.heuristic_choice < 0) listing.heuristic_choice = index;
      if (time) candidate.median_ms = time_plan_ms(*graph, index, pack, at::Device(at::kCUDA, problem.device), repeats);
    }
    listing.candidates.push_back(std::move(candidate));
  }
  // cuDNN's NONDETERMINISTIC note (what the deterministic policy excludes): the candidates that no longer build once
  // deselected by it. Last, because deselection cannot be undone on this graph.
  graph->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
  for (auto& candidate : listing.candidates) {
    if (candidate.error.empty() && graph->build_plan_at_index(candidate.index).is_bad()) {
      candidate.behaviour_notes.push_back("nondeterministic");
    }
  }
  return listing;
}

}  // namespace tcf
