#include "cli/http.h"

#include <cctype>
#include <charconv>

#include "base/error.h"

namespace cupool::cli::http {

namespace {

std::string response(int code, std::string_view reason, std::string_view type, const std::string& body, bool head_only,
                     std::string_view extra = "") {
  std::string out = "HTTP/1.1 " + std::to_string(code) + " " + std::string(reason) + "\r\n";
  out += "Content-Type: " + std::string(type) + "\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  out += extra;
  out += "Connection: close\r\n\r\n";
  if (!head_only) out += body;
  return out;
}

bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

}  // namespace

ListenAddress parse_listen(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return InputError("--listen: '" + text + "' " + why + " (expected HOST:PORT, [IPV6]:PORT or :PORT, e.g. :9402)");
  };
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      throw bad("has no ']:' after the IPv6 address");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    if (host.empty()) throw bad("has an empty IPv6 address");
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string::npos) throw bad("has no port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos) throw bad("is an IPv6 address without brackets");
  }
  int value = -1;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value < 0 || value > 65535)
    throw bad("has no port number from 0 to 65535");
  return {host, value};
}

std::optional<std::size_t> head_end(std::string_view received) {
  const std::size_t crlf = received.find("\r\n\r\n");
  if (crlf != std::string_view::npos) return crlf + 4;
  const std::size_t lf = received.find("\n\n");  // lenient: bare newlines (RFC 9112 allows it)
  if (lf != std::string_view::npos) return lf + 2;
  return std::nullopt;
}

std::string respond(std::string_view head, const std::function<std::string()>& metrics) {
  const std::size_t line_end = head.find('\n');
  std::string_view line = head.substr(0, line_end);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  // METHOD SP TARGET SP HTTP/1.x
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  const std::string_view plain = "text/plain; charset=utf-8";
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
      line.find(' ', sp2 + 1) != std::string_view::npos)
    return response(400, "Bad Request", plain, "a request line is METHOD TARGET HTTP/1.1\n", false);
  const std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (method.empty() || target.empty() || version.rfind("HTTP/1.", 0) != 0)
    return response(400, "Bad Request", plain, "a request line is METHOD TARGET HTTP/1.1\n", false);
  for (char c : method)
    if (!is_token_char(c)) return response(400, "Bad Request", plain, "the method is not a token\n", false);
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only)
    return response(405, "Method Not Allowed", plain, "only GET and HEAD\n", false, "Allow: GET, HEAD\r\n");
  target = target.substr(0, target.find('?'));  // Prometheus may add parameters; none are used
  if (target == "/metrics")
    return response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", metrics(), head_only);
  if (target == "/")
    return response(200, "OK", "text/html; charset=utf-8",
                    "<html><head><title>cupool exporter</title></head><body><h1>cupool exporter</h1>"
                    "<p><a href=\"/metrics\">Metrics</a>: the holder's pools and graph memory.</p></body></html>\n",
                    head_only);
  return response(404, "Not Found", plain, "not found: the metrics are at /metrics\n", head_only);
}

std::string too_large() {
  return response(431, "Request Header Fields Too Large", "text/plain; charset=utf-8",
                  "the request's head is over 8 KiB\n", false);
}

}  // namespace cupool::cli::http
