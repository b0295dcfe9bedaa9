#include "custody/keeper.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "base/error.h"
#include "custody/fields.h"
#include "protocol/protocol.h"
#include "tests/unit/custody/fds.h"
#include "tests/unit/fixtures.h"

using namespace cupool;
using namespace cupool::custody;
using cupool::test::inode;
using cupool::test::memfd;
using Json = nlohmann::ordered_json;

namespace {

// A keeper serving on a thread, in a directory of its own.
class Running {
 public:
  explicit Running(KeeperOptions options = {}, const std::string& socket = "") {
    options.socket = socket.empty() ? test::temp_path("keeper.sock") : socket;
    keeper_ = std::make_unique<Keeper>(options);
    stop_.reset(::eventfd(0, EFD_CLOEXEC));
    thread_ = std::thread([this] { keeper_->serve(stop_.get()); });
  }
  ~Running() {
    const std::uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
    thread_.join();
  }
  const std::string& socket() const { return keeper_->socket(); }

 private:
  std::unique_ptr<Keeper> keeper_;
  Fd stop_;
  std::thread thread_;
};

Fd connect_raw(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  const timeval tv{2, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends `request` (declaring `fds` descriptors, `fd` riding along when >= 0) and returns the reply.
Json ask(int socket, const Json& request, std::uint32_t fds = 0, int fd = -1, Fd* received = nullptr) {
  proto::send_all(socket, proto::encode(proto::Kind::request, request, fds), fd);
  int got = -1;
  Json reply = proto::receive_frame(socket, got).second;
  if (received)
    received->reset(got);
  else if (got >= 0)
    ::close(got);
  return reply;
}

std::string error_code(const Json& reply) {
  return reply.value("ok", true) ? "" : reply["error"]["code"].get<std::string>();
}

// Whether the peer closed the connection (reading gives EOF or a reset).
bool closed(int socket) {
  char c;
  const ssize_t n = ::recv(socket, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

}  // namespace

TEST_SUITE("custody") {
  TEST_CASE("custody: a keeper keeps, lists, gives back, replaces and removes descriptors") {
    Running keeper;
    KeeperClient client(keeper.socket());
    CHECK(client.where() == "keeper at " + keeper.socket());
    const Fd a = memfd("a"), b = memfd("b"), c = memfd("c");
    client.deposit("cupool-buffer.w.0", a.get());
    client.deposit("cupool-manifest.1", c.get());
    CHECK(client.names() == std::vector<std::string>{"cupool-buffer.w.0", "cupool-manifest.1"});
    std::vector<Kept> back = client.withdraw();
    REQUIRE(back.size() == 2);
    CHECK(back[0].name == "cupool-buffer.w.0");
    CHECK(inode(back[0].fd.get()) == inode(a.get()));
    CHECK(inode(back[1].fd.get()) == inode(c.get()));
    CHECK(client.names().size() == 2);  // withdrawing keeps them

    client.deposit("cupool-buffer.w.0", b.get());  // replaces
    back = client.withdraw();
    REQUIRE(back.size() == 2);
    CHECK(inode(back[0].fd.get()) == inode(b.get()));

    client.remove("cupool-buffer.w.0");
    client.remove("cupool-buffer.w.0");  // nothing: fine
    CHECK(client.names() == std::vector<std::string>{"cupool-manifest.1"});
    const KeeperStatusReply status = client.status();
    CHECK(status.kept_count == 1);
    CHECK(status.pid == ::getpid());
    CHECK(status.names == std::vector<std::string>{"cupool-manifest.1"});
    CHECK(status.max_kept_count == kMaxKept);

    client.deposit("x", a.get());
    CHECK(client.release() == 2);
    CHECK(client.names().empty());
    CHECK_THROWS_AS(client.deposit("a/b", a.get()), Error);
  }

  TEST_CASE("custody: the keeper's protocol: hello first, descriptors only with deposit, bounds") {
    KeeperOptions options;
    options.max_kept = 2;
    Running keeper(options);
    const Fd s = connect_raw(keeper.socket());
    CHECK(error_code(ask(s.get(), {{"id", 1}, {"op", "list"}})) == "hello_required");
    CHECK(error_code(ask(s.get(), {{"id", 2}, {"op", "hello"}, {"keeper", 2}})) == "unsupported_protocol");
    const Json hello = ask(s.get(), {{"id", 3}, {"op", "hello"}, {"keeper", 1}});
    CHECK(hello["id"] == 3);
    CHECK(hello["keeper"] == 1);
    CHECK(hello["kept_count"] == 0);
    const Fd a = memfd("a");
    CHECK(error_code(ask(s.get(), {{"id", 4}, {"op", "deposit"}, {"name", "x"}})) == "bad_request");
    CHECK(error_code(ask(s.get(), {{"id", 5}, {"op", "list"}}, 1, a.get())) == "bad_request");
    CHECK(error_code(ask(s.get(), {{"id", 6}, {"op", "deposit"}, {"name", "x:y"}}, 1, a.get())) == "bad_request");
    CHECK(error_code(ask(s.get(), {{"id", 7}, {"op", "deposit"}, {"name", "x"}, {"size", 1}}, 1, a.get())) ==
          "bad_request");
    CHECK(error_code(ask(s.get(), {{"id", 8}, {"op", "withdraw"}, {"name", "x"}})) == "not_found");
    CHECK(error_code(ask(s.get(), {{"id", 9}, {"op", "fly"}})) == "unknown_op");
    const Json kept = ask(s.get(), {{"id", 10}, {"op", "deposit"}, {"name", "x"}}, 1, a.get());
    CHECK(kept["ok"] == true);
    CHECK(kept["replaced"] == false);
    CHECK(ask(s.get(), {{"id", 11}, {"op", "deposit"}, {"name", "x"}}, 1, a.get())["replaced"] == true);
    CHECK(ask(s.get(), {{"id", 12}, {"op", "deposit"}, {"name", "y"}}, 1, a.get())["kept_count"] == 2);
    CHECK(error_code(ask(s.get(), {{"id", 13}, {"op", "deposit"}, {"name", "z"}}, 1, a.get())) == "limit_exceeded");
    Fd got;
    CHECK(ask(s.get(), {{"id", 14}, {"op", "withdraw"}, {"name", "y"}}, 0, -1, &got)["name"] == "y");
    REQUIRE(got);
    CHECK(inode(got.get()) == inode(a.get()));
    // A frame that says it carries a descriptor and doesn't: malformed, closed.
    const Json lie = ask(s.get(), {{"id", 15}, {"op", "deposit"}, {"name", "z"}}, 1, -1);
    CHECK(error_code(lie) == "bad_frame");
    CHECK(lie["id"].is_null());
    CHECK(closed(s.get()));
    // A descriptor on a frame that says none: malformed too.
    const Fd t = connect_raw(keeper.socket());
    ask(t.get(), {{"id", 1}, {"op", "hello"}, {"keeper", 1}});
    CHECK(error_code(ask(t.get(), {{"id", 2}, {"op", "list"}}, 0, a.get())) == "bad_frame");
    CHECK(closed(t.get()));
  }

  TEST_CASE("custody: a keeper that stops leaves neither its socket nor its lock file") {
    std::string socket;
    {
      Running keeper;
      socket = keeper.socket();
      CHECK(::access((socket + ".lock").c_str(), F_OK) == 0);
    }
    CHECK(::access(socket.c_str(), F_OK) != 0);
    CHECK(::access((socket + ".lock").c_str(), F_OK) != 0);
  }

  TEST_CASE("custody: a second keeper on the same socket is refused") {
    Running keeper;
    KeeperOptions options;
    options.socket = keeper.socket();
    try {
      Keeper second(options);
      FAIL("a second keeper started");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unreachable);
      CHECK(std::string(e.what()) == "another keeper (pid " + std::to_string(::getpid()) + ") is serving " +
                                         keeper.socket() + "; stop it first, or use another --socket");
    }
    // The first still serves.
    KeeperClient client(keeper.socket());
    CHECK(client.names().empty());
  }

  TEST_CASE("custody: a peer of another user is refused and closed") {
    KeeperOptions options;
    options.mode = 0666;
    if (::geteuid() == 0) {
      Running keeper(options);
      const std::string dir = keeper.socket().substr(0, keeper.socket().rfind('/'));
      REQUIRE(::chmod(dir.c_str(), 0755) == 0);
      const pid_t child = ::fork();
      REQUIRE(child >= 0);
      if (child == 0) {
        if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
        try {
          KeeperClient client(keeper.socket(), 2000);
          (void)client.names();
          ::_exit(1);
        } catch (const Error& e) {
          ::_exit(e.code() == Errc::not_permitted ? 0 : 2);
        } catch (...) {
          ::_exit(4);
        }
      }
      int status = 0;
      REQUIRE(::waitpid(child, &status, 0) == child);
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    } else {
      options.user = ::geteuid() + 1;  // the test's own user is then not the keeper's
      Running keeper(options);
      KeeperClient client(keeper.socket(), 2000);
      try {
        (void)client.names();
        FAIL("served");
      } catch (const Error& e) {
        CHECK(e.code() == Errc::not_permitted);
      }
    }
  }

  TEST_CASE("custody: a peer that sends garbage is dropped while others are served") {
    Running keeper;
    KeeperClient client(keeper.socket());
    const Fd a = memfd("a");
    client.deposit("kept", a.get());
    const Fd slow = connect_raw(keeper.socket());
    REQUIRE(::send(slow.get(), "CUP", 3, MSG_NOSIGNAL) == 3);  // a frame begun, never finished
    const Fd garbage = connect_raw(keeper.socket());
    const std::string junk = "GET / HTTP/1.1\r\nHost: keeper\r\n\r\n";
    REQUIRE(::send(garbage.get(), junk.data(), junk.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(junk.size()));
    int got = -1;
    const Json reply = proto::receive_frame(garbage.get(), got).second;
    CHECK(error_code(reply) == "bad_frame");
    CHECK(closed(garbage.get()));
    CHECK(client.names() == std::vector<std::string>{"kept"});
    client.deposit("more", a.get());
    CHECK(client.names().size() == 2);
  }

  TEST_CASE("custody: a frame not finished in time closes its connection") {
    KeeperOptions options;
    options.frame_timeout_ms = 100;
    Running keeper(options);
    const Fd slow = connect_raw(keeper.socket());
    REQUIRE(::send(slow.get(), "CUPL", 4, MSG_NOSIGNAL) == 4);
    const auto start = std::chrono::steady_clock::now();
    CHECK(closed(slow.get()));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
    KeeperClient client(keeper.socket());
    CHECK(client.names().empty());
  }

  TEST_CASE("custody: when every connection is taken, the oldest idle one makes room") {
    KeeperOptions options;
    options.max_connections = 2;
    Running keeper(options);
    const Fd first = connect_raw(keeper.socket());
    ask(first.get(), {{"id", 1}, {"op", "hello"}, {"keeper", 1}});
    const Fd second = connect_raw(keeper.socket());
    ask(second.get(), {{"id", 1}, {"op", "hello"}, {"keeper", 1}});
    KeeperClient client(keeper.socket());
    CHECK(client.names().empty());
    CHECK(closed(first.get()));
    CHECK(ask(second.get(), {{"id", 2}, {"op", "list"}})["ok"] == true);
  }

  TEST_CASE("custody: the client connects again once when the keeper restarted, and says when none listens") {
    const std::string socket = test::temp_path("keeper.sock");
    KeeperClient client(socket, 2000);
    try {
      (void)client.names();
      FAIL("a keeper answered");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unreachable);
      CHECK(std::string(e.what()).rfind("no keeper is listening at " + socket, 0) == 0);
    }
    const Fd a = memfd("a");
    {
      Running keeper({}, socket);
      client.deposit("x", a.get());
    }
    Running again({}, socket);
    CHECK(client.names().empty());  // a new keeper: what the old one kept went with it
    client.deposit("y", a.get());
    CHECK(client.names() == std::vector<std::string>{"y"});
    CHECK(keeper_at(socket)->withdraw().size() == 1);
  }
}
