#include "cli/http.h"

#include <doctest/doctest.h>

#include <string>

#include "base/error.h"

using namespace cupool::cli::http;

namespace {

std::string metrics() { return "cupool_holder_up 1\n"; }

std::string status_line(const std::string& response) { return response.substr(0, response.find("\r\n")); }

}  // namespace

TEST_CASE("parse_listen: host:port, [v6]:port, :port, and what is wrong with the rest") {
  CHECK(parse_listen(":9402").host.empty());
  CHECK(parse_listen(":9402").port == 9402);
  CHECK(parse_listen("127.0.0.1:0").host == "127.0.0.1");
  CHECK(parse_listen("127.0.0.1:0").port == 0);
  CHECK(parse_listen("[::1]:9402").host == "::1");
  CHECK(parse_listen("localhost:80").host == "localhost");
  for (const char* bad :
       {"9402", "", ":", "host:", ":65536", ":-1", ":94x2", "[::1]9402", "[]:1", "::1:9402", "[::1"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_listen(bad), cupool::InputError);
  }
  try {
    parse_listen("9402");
  } catch (const cupool::InputError& e) {
    CHECK(std::string(e.what()).find("--listen: '9402' has no port (expected HOST:PORT, [IPV6]:PORT or :PORT") == 0);
  }
}

TEST_CASE("head_end: a request head is complete at its blank line") {
  CHECK_FALSE(head_end("GET /metrics HTTP/1.1\r\nHost: x\r\n"));
  CHECK(*head_end("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") == 34);
  CHECK(*head_end("GET / HTTP/1.0\n\n") == 16);
  CHECK_FALSE(head_end(""));
}

TEST_CASE("respond: /metrics, /, 404, 405, 400") {
  const std::string ok = respond("GET /metrics HTTP/1.1\r\nHost: node\r\nAccept: */*\r\n\r\n", metrics);
  CHECK(status_line(ok) == "HTTP/1.1 200 OK");
  CHECK(ok.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n") != std::string::npos);
  CHECK(ok.find("\r\nContent-Length: 19\r\n") != std::string::npos);
  CHECK(ok.find("\r\nConnection: close\r\n\r\ncupool_holder_up 1\n") != std::string::npos);
  CHECK(status_line(respond("GET /metrics?name[]=x HTTP/1.1\r\n\r\n", metrics)) == "HTTP/1.1 200 OK");

  const std::string head = respond("HEAD /metrics HTTP/1.1\r\n\r\n", metrics);
  CHECK(status_line(head) == "HTTP/1.1 200 OK");
  CHECK(head.find("Content-Length: 19\r\n") != std::string::npos);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");  // no body

  CHECK(status_line(respond("GET / HTTP/1.1\r\n\r\n", metrics)) == "HTTP/1.1 200 OK");
  CHECK(respond("GET / HTTP/1.1\r\n\r\n", metrics).find("href=\"/metrics\"") != std::string::npos);
  CHECK(status_line(respond("GET /metric HTTP/1.1\r\n\r\n", metrics)) == "HTTP/1.1 404 Not Found");
  const std::string post = respond("POST /metrics HTTP/1.1\r\n\r\n", metrics);
  CHECK(status_line(post) == "HTTP/1.1 405 Method Not Allowed");
  CHECK(post.find("\r\nAllow: GET, HEAD\r\n") != std::string::npos);

  // Malformed request lines: 400, and metrics() is not asked.
  bool asked = false;
  const auto count = [&] {
    asked = true;
    return std::string();
  };
  for (const char* bad :
       {"\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n", "GET /metrics HTTP/1.1 extra\r\n\r\n",
        "GET /metrics SPDY/3\r\n\r\n", "G(T /metrics HTTP/1.1\r\n\r\n", " /metrics HTTP/1.1\r\n\r\n"}) {
    CAPTURE(bad);
    CHECK(status_line(respond(bad, count)) == "HTTP/1.1 400 Bad Request");
  }
  CHECK_FALSE(asked);
  CHECK(status_line(too_large()) == "HTTP/1.1 431 Request Header Fields Too Large");
}
