#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "custody/custody.h"
#include "protocol/protocol.h"
#include "tests/unit/custody/fds.h"
#include "tests/unit/fixtures.h"

using namespace cupool;
using namespace cupool::custody;
using cupool::test::inode;
using cupool::test::memfd;

namespace {

// A fake systemd: a datagram socket bound at `address` ("/path" or "@abstract"), NOTIFY_SOCKET
// naming it while it lives.
class FakeNotify {
 public:
  explicit FakeNotify(const std::string& address) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, address.data(), address.size());
    if (address[0] == '@') addr.sun_path[0] = '\0';
    socket_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    REQUIRE(::bind(socket_.get(), reinterpret_cast<const sockaddr*>(&addr),
                   static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size())) == 0);
    ::setenv("NOTIFY_SOCKET", address.c_str(), 1);
  }
  ~FakeNotify() { ::unsetenv("NOTIFY_SOCKET"); }

  // The next datagram's text (empty when none waits) and the descriptor that came with it.
  std::string receive(Fd* fd = nullptr) {
    char text[512];
    std::vector<int> fds;
    bool truncated = false;
    const ssize_t n = proto::receive_some(socket_.get(), text, sizeof text, MSG_DONTWAIT, fds, truncated);
    CHECK(fds.size() <= 1);
    for (int got : fds) {
      if (fd) {
        fd->reset(got);
      } else {
        ::close(got);
      }
    }
    return n < 0 ? "" : std::string(text, static_cast<std::size_t>(n));
  }

 private:
  Fd socket_;
};

}  // namespace

TEST_SUITE("custody") {
  TEST_CASE("custody: systemd's store is there only under NOTIFY_SOCKET") {
    ::unsetenv("NOTIFY_SOCKET");
    CHECK(systemd_store() == nullptr);
    ::setenv("NOTIFY_SOCKET", "", 1);
    CHECK(systemd_store() == nullptr);
    ::unsetenv("NOTIFY_SOCKET");
  }

  TEST_CASE("custody: systemd's store gets FDSTORE with the descriptor, a removal before a name it may hold") {
    const std::string path = test::temp_path("notify");
    FakeNotify systemd(path);
    auto store = systemd_store();
    REQUIRE(store);
    CHECK(std::string(store->kind()) == "systemd");
    CHECK(store->where() == "systemd's file-descriptor store");
    const Fd part = memfd("part");

    // Before withdraw() the store may hold anything: the name is removed first.
    store->deposit("cupool-buffer.a.0", part.get());
    CHECK(systemd.receive() == "FDSTOREREMOVE=1\nFDNAME=cupool-buffer.a.0");
    Fd got;
    CHECK(systemd.receive(&got) == "FDSTORE=1\nFDNAME=cupool-buffer.a.0\nFDPOLL=0");
    REQUIRE(got);
    CHECK(inode(got.get()) == inode(part.get()));
    CHECK(systemd.receive().empty());

    // After it, only names the store holds are removed first.
    CHECK(store->withdraw().empty());  // not started by systemd here
    store->deposit("cupool-buffer.b.0", part.get());
    CHECK(systemd.receive() == "FDSTORE=1\nFDNAME=cupool-buffer.b.0\nFDPOLL=0");
    CHECK(systemd.receive().empty());
    store->deposit("cupool-buffer.b.0", part.get());
    CHECK(systemd.receive() == "FDSTOREREMOVE=1\nFDNAME=cupool-buffer.b.0");
    CHECK(systemd.receive() == "FDSTORE=1\nFDNAME=cupool-buffer.b.0\nFDPOLL=0");
    store->remove("cupool-buffer.b.0");
    CHECK(systemd.receive() == "FDSTOREREMOVE=1\nFDNAME=cupool-buffer.b.0");
    store->deposit("cupool-buffer.b.0", part.get());
    CHECK(systemd.receive() == "FDSTORE=1\nFDNAME=cupool-buffer.b.0\nFDPOLL=0");

    CHECK_THROWS_AS(store->deposit("a:b", part.get()), Error);
    CHECK(systemd.receive().empty());
    ::unlink(path.c_str());
  }

  TEST_CASE("custody: systemd's store on an abstract socket, and an unreachable one") {
    const std::string address = "@cupool-test-notify-" + std::to_string(::getpid());
    {
      FakeNotify systemd(address);
      auto store = systemd_store();
      const Fd part = memfd("part");
      store->remove("cupool-manifest.1");
      CHECK(systemd.receive() == "FDSTOREREMOVE=1\nFDNAME=cupool-manifest.1");
    }
    ::setenv("NOTIFY_SOCKET", (test::temp_path("nobody") + "-here").c_str(), 1);
    auto store = systemd_store();
    try {
      store->remove("x");
      FAIL("sent");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unreachable);
      CHECK(std::string(e.what()).find("can't reach systemd's notify socket") != std::string::npos);
    }
    ::setenv("NOTIFY_SOCKET", "vsock:2:1234", 1);
    store = systemd_store();
    CHECK_THROWS_AS(store->remove("x"), Error);
    ::unsetenv("NOTIFY_SOCKET");
  }

  TEST_CASE("custody: the descriptors systemd passes are named from LISTEN_FDNAMES and made close-on-exec") {
    // Descriptors at 900.. stand for 3.. (a test process has others there).
    const Fd a = memfd("a"), b = memfd("b"), c = memfd("c");
    const int first = 900;
    REQUIRE(::dup2(a.get(), first) == first);
    REQUIRE(::dup2(b.get(), first + 1) == first + 1);
    REQUIRE(::dup2(c.get(), first + 2) == first + 2);
    const std::string me = std::to_string(::getpid());

    // Another process's: nothing taken (and nothing closed).
    CHECK(adopt_listen_fds({"1", "3", "a:b:c"}, ::getpid(), first).empty());
    CHECK(adopt_listen_fds({me, "three", ""}, ::getpid(), first).empty());
    CHECK(adopt_listen_fds({"", "3", ""}, ::getpid(), first).empty());
    CHECK(::fcntl(first, F_GETFD) == 0);  // still open, not yet close-on-exec

    std::vector<Kept> kept = adopt_listen_fds({me, "3", "cupool-manifest.4:cupool-buffer.w.0"}, ::getpid(), first);
    REQUIRE(kept.size() == 3);
    CHECK(kept[0].name == "cupool-manifest.4");
    CHECK(kept[1].name == "cupool-buffer.w.0");
    CHECK(kept[2].name == "unknown");
    CHECK(kept[0].fd.get() == first);
    CHECK(inode(kept[1].fd.get()) == inode(b.get()));
    for (const Kept& k : kept) CHECK((::fcntl(k.fd.get(), F_GETFD) & FD_CLOEXEC) != 0);
    kept.clear();  // closes 900..902
    CHECK(::fcntl(first, F_GETFD) < 0);

    // A descriptor that is not open is left out.
    REQUIRE(::dup2(a.get(), first + 1) == first + 1);
    kept = adopt_listen_fds({me, "2", "x:y"}, ::getpid(), first);
    REQUIRE(kept.size() == 1);
    CHECK(kept[0].name == "y");
  }

  TEST_CASE("custody: withdraw() takes LISTEN_* once and unsets them") {
    const std::string path = test::temp_path("notify");
    FakeNotify systemd(path);
    ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
    ::setenv("LISTEN_FDS", "0", 1);
    ::setenv("LISTEN_FDNAMES", "", 1);
    auto store = systemd_store();
    CHECK(store->withdraw().empty());
    CHECK(std::getenv("LISTEN_PID") == nullptr);
    CHECK(std::getenv("LISTEN_FDS") == nullptr);
    CHECK(std::getenv("LISTEN_FDNAMES") == nullptr);
    CHECK(store->withdraw().empty());
    ::unlink(path.c_str());
  }
}
