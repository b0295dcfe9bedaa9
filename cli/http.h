// The little HTTP that `cupool exporter` speaks: enough of HTTP/1.1 for a Prometheus scrape and a
// person with curl, and nothing a peer can use to make it hold memory or time. Kept free of
// sockets so it is tested on its own (tests/unit/cli/http_test.cpp).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace cupool::cli::http {

// The most a request's head (request line and headers) may take; a longer one is answered 431.
inline constexpr std::size_t kMaxHead = 8192;

// Where to listen: "HOST:PORT", "[IPV6]:PORT" or ":PORT" (every interface). Throws InputError
// naming what is wrong.
struct ListenAddress {
  std::string host;  // "" for every interface
  int port = 0;      // 0: any free port (the one taken is logged)
};
ListenAddress parse_listen(const std::string& text);

// Where the head of a request ends in `received` (just past the blank line), or nullopt when it
// has not all arrived yet.
std::optional<std::size_t> head_end(std::string_view received);

// The full response (status line, headers, body) to a request whose head is `head`:
// GET or HEAD of /metrics is 200 with `metrics()` in the Prometheus text format (version 0.0.4);
// / is a short page that points there; another path is 404, another method 405, a malformed
// request 400. Every response closes the connection.
std::string respond(std::string_view head, const std::function<std::string()>& metrics);

// The response to a head over kMaxHead bytes.
std::string too_large();

}  // namespace cupool::cli::http
