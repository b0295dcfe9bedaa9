// Fuzz target: config text -> parser -> checks -> rendered findings, and for a file that fits, its
// process section applied twice to a simulated node (the second time must change nothing).
// Nothing may crash, hang or throw. Built two ways (tests/fuzz/CMakeLists.txt): with libFuzzer when CUPOOL_FUZZ=ON (clang),
// and always as a deterministic driver (mutate_main.cpp) that CTest runs under the sanitizers.
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/output.h"
#include "config/config.h"
#include "config/load.h"
#include "device/sim_backend.h"
#include "holder/holder.h"
#include "process/process.h"
#include "tests/unit/fixtures.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > cupool::kMaxConfigBytes) return 0;  // SourceFile::read refuses these before parsing
  static const cupool::NodeReport node = [] {
    cupool::NodeReport n = cupool::test::two_gpu_node();
    n.peer_access[1][0] = false;  // exercise the peer rule both ways
    n.devices[1].info.pool_handle_types = 0x1;
    return n;
  }();
  const cupool::SourceFile file("fuzz.yaml", std::string(reinterpret_cast<const char*>(data), size));
  cupool::CheckOptions options;
  options.deep = (size % 2) == 0;
  const cupool::Judged judged = cupool::judge_config(file, [] { return node; }, cupool::Scope::all, options);
  const cupool::Diagnostics& diags = judged.diags;
  const cupool::Config& config = judged.config;
  if (!diags.has_invalid_input() && !diags.has_errors() && config.process) {
    cupool::SimBackend sim(node);
    try {
      cupool::configure_process(sim, file.text(), file.path());
      if (!cupool::configure_process(sim, file.text(), file.path()).changes.empty()) __builtin_trap();
    } catch (const cupool::ConfigRejected&) {
      // configure judges only the process section, so it can't refuse what check accepted.
      __builtin_trap();
    } catch (const cupool::CudaError&) {
      // A refusal of the simulated driver (e.g. a reserve its arena can't hold) is an answer.
    }
  }
  const std::string text = cupool::render_text(diags, file);
  for (const auto& d : diags.all()) (void)cupool::dump_json(cupool::to_json(d, file.path()));
  (void)cupool::to_yaml(cupool::to_json(diags.all().empty() ? cupool::Diagnostic{} : diags.all().front(), file.path()));
  return text.empty() && diags.has_errors() ? 1 : 0;  // findings always render
}
