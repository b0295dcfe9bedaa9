// Fuzz target: bytes a scraper (or anyone who reaches the port) sends `cupool exporter` ->
// where the request's head ends (http::head_end) -> the response (http::respond), and the same
// bytes' first line as a --listen address (http::parse_listen). The response must be well formed
// whatever came in: a status line of a status the exporter uses, a Content-Length equal to the
// body's size (no body for HEAD), "Connection: close", the metrics only for GET or HEAD of
// /metrics, and nothing of the request echoed into the head. A bad address must be an
// InputError naming --listen; an accepted one has a port from 0 to 65535.
// Built like the other targets (tests/fuzz/CMakeLists.txt): libFuzzer with CUPOOL_FUZZ=ON, and a
// deterministic driver (mutate_main.cpp) that CTest runs, under the sanitizers in scripts/test.sh.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.h"
#include "cli/http.h"

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

const std::string kMetrics = "# TYPE cupool_holder_up gauge\ncupool_holder_up 1\n";

void check_response(std::string_view head) {
  bool asked = false;
  const std::string out = cupool::cli::http::respond(head, [&] {
    asked = true;
    return kMetrics;
  });
  require(out.rfind("HTTP/1.1 ", 0) == 0);
  const int code = std::stoi(out.substr(9, 3));
  require(code == 200 || code == 400 || code == 404 || code == 405);
  const std::size_t end = out.find("\r\n\r\n");
  require(end != std::string::npos);
  const std::string_view response_head = std::string_view(out).substr(0, end + 4);
  const std::string_view body = std::string_view(out).substr(end + 4);
  require(response_head.find("Connection: close\r\n") != std::string_view::npos);
  // Only our own bytes in the head: printable ASCII and CRLF.
  for (char c : response_head) require(c == '\r' || c == '\n' || (c >= 0x20 && c < 0x7f));
  const std::size_t length_at = response_head.find("Content-Length: ");
  require(length_at != std::string_view::npos);
  const std::size_t length = std::stoul(std::string(response_head.substr(length_at + 16)));
  const bool head_only = head.rfind("HEAD ", 0) == 0 && code != 400 && code != 405;
  require(head_only ? body.empty() : body.size() == length);
  // The metrics are gathered (a scrape of the holder) only for GET or HEAD of /metrics.
  const std::string_view line = head.substr(0, head.find('\n'));
  require(asked == (code == 200 && (line.find(" /metrics ") != std::string_view::npos ||
                                    line.find(" /metrics?") != std::string_view::npos)));
  if (asked && !head_only) require(body == kMetrics);
}

void check_listen(std::string_view input) {
  const std::string line(input.substr(0, input.find('\n')));
  try {
    const auto where = cupool::cli::http::parse_listen(line);
    require(where.port >= 0 && where.port <= 65535);
  } catch (const cupool::InputError& e) {
    require(std::string_view(e.what()).rfind("--listen: ", 0) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  // As the exporter does: a head within kMaxHead is answered, a longer one refused with 431.
  if (const auto end = cupool::cli::http::head_end(input)) {
    require(*end <= input.size());
    if (*end <= cupool::cli::http::kMaxHead) check_response(input.substr(0, *end));
  }
  // A head that never ends is answered too (the exporter's deadline): respond takes any prefix.
  check_response(input.substr(0, std::min(input.size(), cupool::cli::http::kMaxHead)));
  check_listen(input);
  return 0;
}
