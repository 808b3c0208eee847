// Engine listing for one graph of a conv layer (the "engines" command and torch_cudnn_fusion.engines()).
#pragma once

#include <string>
#include <vector>

#include "graphs/conv_graphs.h"

namespace tcf {

struct EngineCandidate {
  int64_t index = 0;                          // position in the heuristic's list (its order of preference)
  std::string name;                           // engine id and knob choices, e.g. "eng4_k2=1_k3=0"
  std::vector<std::string> behaviour_notes;   // e.g. "runtime_compilation", "nondeterministic"
  int64_t workspace_bytes = 0;
  std::string error;                          // why this candidate does not build ("" when it does)
  float median_ms = -1.0f;                    // measured when asked for; negative otherwise
  double build_seconds = 0;                   // the time its build took (or failed in): what tuning pays a candidate
};

struct EngineListing {
  std::vector<EngineCandidate> candidates;
  int64_t heuristic_choice = -1;  // the candidate the default (heuristic) policy runs: the first that builds
  std::string refusal;            // set when cuDNN refused the graph itself
};

// Every candidate cuDNN's heuristics (mode A) offer for `kind` over `problem`, as the plan cache would build them
// (same graph, same numerical-note exclusions, and problem.policy's deterministic and workspace limits). With `time`, each buildable one runs `repeats` times on random data.
EngineListing list_engines(GraphKind kind, const ConvProblem& problem, bool time, int repeats);

}  // namespace tcf
