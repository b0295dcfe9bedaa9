// Fuzz target: a custody manifest's text (custody/custody.h) -> a sealed memfd -> open_manifest, as
// a holder reads what custody kept (and the same text as the node report kept beside it, open_node). Each input is read
// twice: as it is (its digest as written, so mostly refused for the digest), and with the right digest put in, so that
// mutations reach the checks of every field. A refusal must be an Error(invalid_input) naming the manifest (never
// another exception); what is accepted must keep the invariants: the parts add up to the size, each part mapped whole,
// at most kMaxParts parts a buffer and kMaxKept in all, each buffer's part names reading back as the buffer and part;
// and the manifest written again reads back the same. The input's first line is also read as a descriptor's name: a
// name that parses is the name written. Built like the other targets (tests/fuzz/CMakeLists.txt): libFuzzer with
// CUPOOL_FUZZ=ON, and a deterministic driver (mutate_main.cpp) that CTest runs, under the sanitizers in
// scripts/test.sh.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.h"
#include "base/json_reader.h"
#include "custody/custody.h"

namespace {

using cupool::custody::Manifest;
using Json = nlohmann::ordered_json;

const std::string kName = "cupool-manifest.7";

void require(bool ok) {
  if (!ok) __builtin_trap();
}

cupool::Fd sealed(std::string_view text) {
  cupool::Fd fd(::memfd_create("fuzz-manifest", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  require(static_cast<bool>(fd));
  std::size_t put = 0;
  while (put < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + put, text.size() - put);
    require(n > 0);
    put += static_cast<std::size_t>(n);
  }
  require(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0);
  return fd;
}

void check_accepted(const Manifest& m) {
  std::size_t parts = 0;
  for (const auto& b : m.buffers) {
    require(!b.parts.empty() && b.parts.size() <= cupool::custody::kMaxParts && b.mapped.size() == b.parts.size());
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < b.parts.size(); ++i) {
      require(b.parts[i] >= 1 && b.mapped[i] >= b.parts[i]);
      sum += b.parts[i];
      const auto back = cupool::custody::parse_part_fd_name(cupool::custody::part_fd_name(b.name, i));
      require(back && back->first == b.name && back->second == i);
      require(cupool::custody::valid_fd_name(cupool::custody::part_fd_name(b.name, i)));
    }
    require(sum == b.size);
    require(b.index.is_null() || b.index.is_object());
    parts += b.parts.size();
  }
  require(parts <= cupool::custody::kMaxKept);
  require(m.sequence == 7);  // its name says so
  // Written again, it reads back the same.
  try {
    const cupool::Fd again = cupool::custody::seal_manifest(m);
    require(cupool::custody::to_json(cupool::custody::open_manifest(again.get(), kName)) ==
            cupool::custody::to_json(m));
  } catch (const cupool::Error&) {
    require(false);
  }
}

void read_manifest(std::string_view text) {
  if (text.empty()) return;  // an empty memfd: refused before anything is read
  const cupool::Fd fd = sealed(text);
  try {
    check_accepted(cupool::custody::open_manifest(fd.get(), kName));
  } catch (const cupool::Error& e) {
    require(e.code() == cupool::Errc::invalid_input);
    require(std::string_view(e.what()).substr(0, 9 + kName.size() + 2) == "manifest " + kName + ": ");
  }
}

// The same text as the node report kept beside the manifest (custody::open_node): refused as
// invalid_input naming it, or read with a fingerprint and a report object.
void read_node(std::string_view text) {
  if (text.empty()) return;
  const cupool::Fd fd = sealed(text);
  try {
    const cupool::custody::KeptNode node = cupool::custody::open_node(fd.get());
    require(!node.fingerprint.empty() && node.fingerprint.size() <= 200 && node.report.is_object());
    const cupool::Fd again = cupool::custody::seal_node(node);
    const cupool::custody::KeptNode back = cupool::custody::open_node(again.get());
    require(back.fingerprint == node.fingerprint && back.report == node.report && back.written == node.written);
  } catch (const cupool::Error& e) {
    require(e.code() == cupool::Errc::invalid_input);
    require(std::string_view(e.what()).rfind(cupool::custody::kNodeFdName, 0) == 0);
  }
}

void read_names(std::string_view input) {
  const std::string line(input.substr(0, input.find('\n')));
  if (const auto part = cupool::custody::parse_part_fd_name(line))
    require(cupool::custody::part_fd_name(part->first, part->second) == line && cupool::custody::valid_fd_name(line));
  if (const auto sequence = cupool::custody::parse_manifest_fd_name(line))
    require(cupool::custody::manifest_fd_name(*sequence) == line && cupool::custody::valid_fd_name(line));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  read_names(input);
  read_manifest(input);
  read_node(input);
  // The same JSON with the digest it should have.
  Json j;
  try {
    cupool::JsonLimits limits;
    limits.max_depth = 32;
    j = cupool::read_json(input, limits);
  } catch (const cupool::JsonReadError&) {
    return 0;
  }
  if (!j.is_object()) return 0;
  j.erase("digest");
  try {
    j["digest"] = cupool::custody::manifest_digest(j);
  } catch (const nlohmann::json::exception&) {
    return 0;  // text that is not UTF-8: refused as such above
  }
  read_manifest(j.dump(-1, ' ', false, Json::error_handler_t::replace));
  read_node(j.dump(-1, ' ', false, Json::error_handler_t::replace));
  return 0;
}
