// cupool exporter: the holder's metrics over HTTP, for a Prometheus scrape. A process of its own
// that asks the holder over its socket at every scrape, so the holder opens no TCP port.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "base/fd.h"
#include "cli/holder_client.h"
#include "cli/holder_render.h"
#include "cli/http.h"
#include "cli/verbs.h"
#include "protocol/messages.h"

namespace cupool::cli {

namespace {

struct ExporterArgs {
  std::string listen = "127.0.0.1:9402";  // loopback unless told otherwise (issue 22)
  std::string socket;
};

// Bounds on peers (issue 22: 64 idle connections held every slot for 10 s, a scrape waited 9 s
// under slowloris and 20 s behind 2,000 idle connects). No one address holds more than
// kMaxPerAddress connections; when every slot is taken, the oldest connection that has not sent
// its request yet makes room for the new one. A scrape sends its request at once, so it is
// served; idle and slow peers only push each other out.
constexpr std::size_t kMaxConnections = 512;
constexpr std::size_t kMaxPerAddress = 16;
constexpr std::size_t kAcceptsPerTurn = 64;                // of the backlog, each turn of the loop
constexpr auto kRequestTimeout = std::chrono::seconds(5);  // to send a whole request head
// The holder is asked at most once a second, over one connection kept between scrapes: scrapes
// in between get the last answer (36,471 scrapes in 10 s cost the holder 3.6 s of CPU, each a
// new connection).
constexpr auto kMinHolderInterval = std::chrono::seconds(1);

volatile std::sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

// The listening socket: every interface (IPv6 and IPv4 where the host has IPv6), or the host's
// addresses.
Fd listen_on(const http::ListenAddress& where, std::string* shown) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_family = AF_UNSPEC;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(where.port);
  if (const int rc = ::getaddrinfo(where.host.empty() ? nullptr : where.host.c_str(), port.c_str(), &hints, &found))
    throw InputError("--listen: can't resolve '" + where.host + "': " + ::gai_strerror(rc));
  std::string last_error = "no address";
  Fd fd;
  // Every interface: prefer one IPv6 socket that takes IPv4 too.
  std::vector<addrinfo*> order;
  for (addrinfo* a = found; a; a = a->ai_next)
    if (where.host.empty() && a->ai_family == AF_INET6)
      order.insert(order.begin(), a);
    else
      order.push_back(a);
  for (addrinfo* a : order) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!s) continue;
    const int one = 1, zero = 0;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6 && where.host.empty())
      ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (::bind(s.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.get(), 64) == 0) {
      fd = std::move(s);
      break;
    }
    last_error = std::strerror(errno);
  }
  ::freeaddrinfo(found);
  if (!fd)
    throw Error(Errc::unreachable, "can't listen on " + (where.host.empty() ? std::string("*") : where.host) + ":" +
                                       port + ": " + last_error);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  char host[INET6_ADDRSTRLEN] = "?";
  int bound_port = 0;
  if (bound.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&bound);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    bound_port = ntohs(in6->sin6_port);
    *shown = "[" + std::string(host) + "]:" + std::to_string(bound_port);
  } else {
    const auto* in4 = reinterpret_cast<const sockaddr_in*>(&bound);
    ::inet_ntop(AF_INET, &in4->sin_addr, host, sizeof host);
    bound_port = ntohs(in4->sin_port);
    *shown = std::string(host) + ":" + std::to_string(bound_port);
  }
  return fd;
}

// The metrics a scrape gets (HolderMetrics: the holder's stats, or the build info alone, then
// cupool_holder_up), asked at most once a second: scrapes in between get the last answer.
class Scraper {
 public:
  Scraper(const std::string& socket, const Context& ctx)
      : metrics_(socket, "cupool exporter", ctx, proto::to_json(proto::Stats{})) {}

  std::string metrics() {
    const auto now = std::chrono::steady_clock::now();
    if (!last_.empty() && now - asked_ < kMinHolderInterval) return last_;
    asked_ = now;
    last_ = metrics_.scrape();
    return last_;
  }

 private:
  HolderMetrics metrics_;
  std::string last_;  // the last answer, and when the holder was asked for it
  std::chrono::steady_clock::time_point asked_{};
};

// A connection: first its request head arrives (kRequestTimeout to send it), then its response
// goes out as the peer reads it (kResponseTimeout). Nothing waits on one peer: a peer that sends
// slowly or does not read holds its own buffers, never the loop.
struct Peer {
  Fd fd;
  std::string address;  // the peer's address, as bytes (kMaxPerAddress)
  std::chrono::steady_clock::time_point accepted;
  std::string received;
  std::string reply;  // set once the head is in: what is left to send
  std::size_t sent = 0;
  std::chrono::steady_clock::time_point deadline;
};

constexpr auto kResponseTimeout = std::chrono::seconds(10);  // to read the whole response

// Sends what the socket takes now; false when the peer is gone.
bool send_some(Peer& p) {
  while (p.sent < p.reply.size()) {
    const ssize_t n = ::send(p.fd.get(), p.reply.data() + p.sent, p.reply.size() - p.sent, MSG_NOSIGNAL);
    if (n > 0) {
      p.sent += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  }
  return true;
}

// Reads what arrived; once the head is in (or too long), the reply is made. false when the peer
// is gone.
bool receive(Peer& p, Scraper& scraper) {
  char buf[4096];
  const ssize_t got = ::recv(p.fd.get(), buf, sizeof buf, 0);
  if (got == 0) return false;
  if (got < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  p.received.append(buf, static_cast<std::size_t>(got));
  if (const auto end = http::head_end(p.received); end && *end <= http::kMaxHead)
    p.reply = http::respond(std::string_view(p.received).substr(0, *end), [&] { return scraper.metrics(); });
  else if (p.received.size() > http::kMaxHead)
    p.reply = http::too_large();
  if (!p.reply.empty()) {
    p.received.clear();
    p.received.shrink_to_fit();
    p.deadline = std::chrono::steady_clock::now() + kResponseTimeout;
  }
  return true;
}

// The peer's address as bytes: IPv4 and IPv4-mapped IPv6 alike.
std::string address_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    const auto& in4 = reinterpret_cast<const sockaddr_in&>(a).sin_addr;
    return std::string(reinterpret_cast<const char*>(&in4), sizeof in4);
  }
  if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&in6)) return std::string(reinterpret_cast<const char*>(&in6) + 12, 4);
    return std::string(reinterpret_cast<const char*>(&in6), sizeof in6);
  }
  return {};
}

// Closes the peer that has waited longest without sending its request, among those `which`
// picks; false when there is none.
template <typename Which>
bool drop_oldest_idle(std::vector<Peer>& peers, Which which) {
  auto oldest = peers.end();
  for (auto it = peers.begin(); it != peers.end(); ++it)
    if (it->reply.empty() && which(*it) && (oldest == peers.end() || it->accepted < oldest->accepted)) oldest = it;
  if (oldest == peers.end()) return false;
  peers.erase(oldest);
  return true;
}

// Accepts one connection from the backlog, within the bounds; false when the backlog is empty.
bool accept_one(const Fd& listener, std::vector<Peer>& peers) {
  sockaddr_storage from{};
  socklen_t len = sizeof from;
  Fd fd(::accept4(listener.get(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (!fd) return errno == EINTR || errno == ECONNABORTED;
  std::string address = address_of(from);
  const auto same = [&](const Peer& p) { return p.address == address; };
  // One address: its own oldest idle connection makes room, else the new one is turned away.
  if (static_cast<std::size_t>(std::count_if(peers.begin(), peers.end(), same)) >= kMaxPerAddress &&
      !drop_oldest_idle(peers, same))
    return true;
  if (peers.size() >= kMaxConnections && !drop_oldest_idle(peers, [](const Peer&) { return true; })) return true;
  const auto now = std::chrono::steady_clock::now();
  peers.push_back({std::move(fd), std::move(address), now, {}, {}, 0, now + kRequestTimeout});
  return true;
}

int serve(const ExporterArgs& args, const Context& ctx) {
  const http::ListenAddress where = http::parse_listen(args.listen);
  std::string shown;
  Fd listener = listen_on(where, &shown);
  struct sigaction sa {};
  sa.sa_handler = on_stop;  // no SA_RESTART: poll returns at once
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  std::cerr << "cupool exporter: serving http://" << shown << "/metrics (the holder at "
            << (args.socket.empty() ? "$CUPOOL_SOCKET or the default socket" : args.socket) << ")" << std::endl;

  Scraper scraper(args.socket, ctx);
  std::vector<Peer> peers;
  while (!g_stop) {
    // The listener is read while a slot is free or some peer has not asked yet (it makes room).
    const bool can_make_room = std::any_of(peers.begin(), peers.end(), [](const Peer& p) { return p.reply.empty(); });
    std::vector<pollfd> fds{
        {listener.get(), static_cast<short>(peers.size() < kMaxConnections || can_make_room ? POLLIN : 0), 0}};
    for (const Peer& p : peers) fds.push_back({p.fd.get(), static_cast<short>(p.reply.empty() ? POLLIN : POLLOUT), 0});
    const int n = ::poll(fds.data(), fds.size(), 1000);
    if (n < 0 && errno != EINTR) throw Error(Errc::unreachable, std::string("poll: ") + std::strerror(errno));
    std::vector<bool> done(peers.size(), false);
    for (std::size_t i = 0; i < peers.size(); ++i) {
      Peer& p = peers[i];
      const short ev = fds[i + 1].revents;
      if (p.reply.empty() && (ev & (POLLIN | POLLHUP | POLLERR))) done[i] = !receive(p, scraper);
      // A reply just made is tried at once: most fit the socket's buffer.
      if (!done[i] && !p.reply.empty()) done[i] = !send_some(p) || p.sent == p.reply.size();
      if (!done[i] && (ev & (POLLHUP | POLLERR)) && !p.reply.empty()) done[i] = true;
      // Too slow to ask or to read: closed, the answer unsent.
      if (std::chrono::steady_clock::now() >= p.deadline) done[i] = true;
    }
    for (std::size_t i = peers.size(); i-- > 0;)
      if (done[i]) peers.erase(peers.begin() + static_cast<std::ptrdiff_t>(i));
    if (fds[0].revents & POLLIN)
      for (std::size_t k = 0; k < kAcceptsPerTurn; ++k)
        if (!accept_one(listener, peers)) break;
  }
  std::cerr << "cupool exporter: stopped\n";
  return static_cast<int>(ExitCode::ok);
}

}  // namespace

Verb add_exporter(CLI::App& app) {
  auto args = std::make_shared<ExporterArgs>();
  CLI::App* sub = app.add_subcommand("exporter", "Serve the holder's metrics over HTTP for Prometheus");
  sub->footer(
      "\n"
      "Listens on --listen and answers GET /metrics with what 'cupool stats --format prometheus' prints, asking\n"
      "the holder over its socket at each scrape (the holder itself opens no TCP port), plus cupool_holder_up\n"
      "(0 while the holder is down or refuses: the exporter keeps answering). Every series of a pool or a\n"
      "device has dcgm-exporter's labels, gpu, UUID, pci_bus_id, modelName (the GPU's name) and Hostname, so\n"
      "dashboards join the two; held buffers and tensor sets are cupool_pool_held_bytes and _buffers per\n"
      "pool, cupool_device_held_* per device; cupool_build_info names the version. Any user the holder lets\n"
      "read stats may run it. It listens on loopback (127.0.0.1:9402) unless --listen says otherwise: ':9402'\n"
      "is every interface, for a Prometheus on another host. The holder is asked at most once a second, over\n"
      "one kept connection (scrapes in between get the last answer). Peers are bounded: 8 KiB heads, 5 s to\n"
      "send one, 10 s to read the answer, 512 connections at once and 16 of one address; when all are taken,\n"
      "the oldest that has not sent its request is closed to make room.\n"
      "Runs until SIGTERM or Ctrl-C.\n"
      "\nExamples:\n"
      "  cupool exporter                                   # loopback, port 9402\n"
      "  cupool exporter --listen :9402 --socket /run/cupool/cupool.sock   # every interface\n"
      "  curl -s localhost:9402/metrics | grep cupool_pool_used_bytes\n"
      "\nExit codes: 0 stopped by a signal, 2 a bad --listen, 4 the address can't be listened on.");
  sub->add_option("--listen,-l", args->listen,
                  "HOST:PORT, [IPV6]:PORT or :PORT (every interface) to serve on (default: loopback)")
      ->capture_default_str();
  add_socket_option(sub, args->socket);
  return {sub, [args](Context& ctx) { return serve(*args, ctx); }};
}

}  // namespace cupool::cli
