// Saving and loading built plans (torch_cudnn_fusion.save_plan_cache / load_plan_cache): what each cached plan is
// for (its key), which candidate runs and why (autotune results), and cuDNN's serialized plan where it has one.
// The file format itself (environment header, checksum, JSON) is Python's (torch_cudnn_fusion/diagnostics/plan_file.py).
#pragma once

#include <string>
#include <vector>

#include "graphs/conv_graphs.h"

namespace tcf {

struct SavedPlan {
  GraphKey key;
  std::string engine;        // cuDNN's name of the candidate in use
  int64_t index = -1;        // its position in the heuristic's list (-1: unknown, e.g. a deserialized plan)
  bool tuned = false;        // chosen by timing: loading it skips the timing
  bool aten_faster = false;  // autotune ran the ATen composition instead
  float tuned_ms = -1.0f;
  float aten_ms = -1.0f;
  std::vector<uint8_t> serialized;  // cuDNN's serialized plan; empty where not supported (see serialize_note)
  std::string serialize_note;       // why there is none
};

// Every built plan in the cache (refusals are not saved: they are rebuilt, and cheaply).
std::vector<SavedPlan> saved_plans();

// Puts a saved plan back in the cache: deserialized when it carries cuDNN's serialized plan, else rebuilt with the
// saved candidate (no heuristic query, no timing). Returns "" or why it was not loaded (the plan is then built
// afresh when first needed). A plan for another GPU generation or cuDNN version is never loaded.
std::string load_saved_plan(const SavedPlan& saved);

}  // namespace tcf
