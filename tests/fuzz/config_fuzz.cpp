// Fuzz target: config text -> parser -> checks -> rendered findings (each within the documented
// bounds: at most kMaxFindings kept, each finding's text bounded whatever the file holds, valid
// UTF-8); for a file that fits, its process section applied twice to a simulated node (the second
// time must change nothing), and a reload of it into a holder that holds a base config (as SIGHUP
// does: the reload, again with nothing left to change but what stays blocked, and back to the base).
// Nothing may crash, hang or throw. Built two ways (tests/fuzz/CMakeLists.txt): with libFuzzer when CUPOOL_FUZZ=ON
// (clang), and always as a deterministic driver (mutate_main.cpp) that CTest runs under the sanitizers.
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "base/output.h"
#include "base/text.h"
#include "config/config.h"
#include "config/load.h"
#include "device/sim_backend.h"
#include "holder/holder.h"
#include "process/process.h"
#include "tests/unit/fixtures.h"

namespace {

// The holder's config before the reload: pools and a buffer on the devices of the fuzz node.
const char* const kBase = R"(version: 1
pools:
  - name: kv
    devices: [0]
    handle_types: [posix_fd]
    max_size: 1GiB
    release_threshold: max
    reserve: 64MiB
  - name: local
    devices: [1]
    max_size: 256MiB
buffers:
  - {name: weights, pool: kv, device: 0, size: 16MiB}
)";

// What one rendered finding may take: its location and code, message, fact and help (each
// bounded to kMaxFindingText, "..." added), a window of its line (kMaxQuotedLine, "..." on each
// side, each byte at most a 3-byte replacement character) and the caret under it.
std::size_t finding_bound(const cupool::SourceFile& file) {
  return file.path().size() + 64 + 3 * (cupool::kMaxFindingText + 3 + 16) + 3 * (cupool::kMaxQuotedLine + 6) +
         (cupool::kMaxQuotedLine + 6 + 16);
}

void check_rendering(const cupool::Diagnostics& diags, const cupool::SourceFile& file) {
  if (diags.all().size() > cupool::kMaxFindings) __builtin_trap();
  const std::size_t bound = finding_bound(file);
  for (const auto& d : diags.all()) {
    const std::string one = cupool::render_text(d, file);
    if (one.size() > bound || cupool::valid_utf8(one) != one) __builtin_trap();
    const std::string json = cupool::dump_json(cupool::to_json(d, file.path()));
    if (json.size() > 8 * bound) __builtin_trap();
  }
}

// SIGHUP with this file (core/holder/server.cpp Server::reload): the holder applies what it asks.
void reload(const cupool::NodeReport& node, const cupool::Desired& want) {
  static const cupool::Desired base =
      cupool::load_config(
          cupool::SourceFile("base.yaml", kBase), [&] { return node; }, cupool::Scope::all)
          .desired;
  cupool::SimBackend sim(node);
  cupool::Holder holder(sim, node, /*self_uid=*/0);
  holder.apply(base);
  try {
    holder.apply(want);
  } catch (const cupool::Error&) {
    return;  // refused or failed part way (a driver error): an answer, and the state is the holder's
  }
  // Reloading the same file again changes nothing but what stays blocked (in use, or the socket).
  for (const auto& change : holder.apply(want))
    if (change.blocked.empty()) __builtin_trap();
  try {
    holder.apply(base);  // and back
  } catch (const cupool::Error&) {
  }
}

}  // namespace

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
  const cupool::Judged judged = cupool::judge_config(
      file, [] { return node; }, cupool::Scope::all, options);
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
  if (!judged.rejected() && judged.desired) reload(node, *judged.desired);
  check_rendering(diags, file);
  const std::string text = cupool::render_text(diags, file);
  for (const auto& d : diags.all()) (void)cupool::dump_json(cupool::to_json(d, file.path()));
  (void)cupool::to_yaml(cupool::to_json(diags.all().empty() ? cupool::Diagnostic{} : diags.all().front(), file.path()));
  return text.empty() && diags.has_errors() ? 1 : 0;  // findings always render
}
