// Custody as the holder uses it (core/holder/adopt.cpp): what it gives custody and when, what a
// custody that fails or is slow may cost the serving thread, and what it adopts at its start.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "base/error.h"
#include "base/fd.h"
#include "config/load.h"
#include "custody/custody.h"
#include "device/sim_backend.h"
#include "holder/holder.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/holder/requests.h"

using namespace cupool;

namespace adopt_test {

using Clock = std::chrono::steady_clock;

const char* const kCustodyConfig = R"(version: 1
holder: {socket: /tmp/cupool-unit.sock, mode: "0666"}
pools:
  - {name: kv, devices: [0], handle_types: [posix_fd], max_size: 4GiB}
buffers:
  - {name: weights, pool: kv, device: 0, size: 2MiB}
)";

const std::string kUuid0 = "GPU-00000000-0000-4000-8000-000000000000";

// A keeper in this process: what it keeps, a switch that makes every call fail, and a delay per
// call that honours the holder's deadline as the real client does (its socket's time-outs).
class FakeCustody final : public custody::Custody {
 public:
  std::map<std::string, Fd> kept;
  bool down = false;
  std::chrono::milliseconds delay{0};
  int calls = 0;

  const char* kind() const override { return "keeper"; }
  std::string where() const override { return "the test's keeper"; }
  std::vector<custody::Kept> withdraw() override {
    std::vector<custody::Kept> out;
    for (const auto& [name, fd] : kept) out.push_back({name, Fd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 3))});
    return out;
  }
  void deposit(const std::string& name, int fd) override {
    call();
    kept[name] = Fd(::fcntl(fd, F_DUPFD_CLOEXEC, 3));
  }
  void remove(const std::string& name) override {
    call();
    kept.erase(name);
  }
  std::optional<std::vector<std::string>> list() override {
    call();
    std::vector<std::string> names;
    for (const auto& [name, fd] : kept) names.push_back(name);
    return names;
  }
  void limit_time(std::optional<Clock::time_point> deadline) override { deadline_ = deadline; }

  // The newest manifest kept, read back.
  custody::Manifest manifest() const {
    for (auto it = kept.rbegin(); it != kept.rend(); ++it)
      if (custody::parse_manifest_fd_name(it->first)) return custody::open_manifest(it->second.get(), it->first);
    FAIL("no manifest is kept");
    return {};
  }
  int manifest_count() const {
    int n = 0;
    for (const auto& [name, fd] : kept) n += custody::parse_manifest_fd_name(name) ? 1 : 0;
    return n;
  }

 private:
  void call() {
    ++calls;
    if (down) throw Error(Errc::unreachable, "it does not answer");
    if (delay.count()) {
      const auto until = Clock::now() + delay;
      if (deadline_ && until > *deadline_) {
        std::this_thread::sleep_until(*deadline_);
        throw Error(Errc::unreachable, "it did not answer in the time custody has");
      }
      std::this_thread::sleep_until(until);
    }
  }
  std::optional<Clock::time_point> deadline_;
};

struct CustodyHolder {
  SimBackend sim{test::two_gpu_node()};
  Holder holder{sim, test::two_gpu_node(), /*self_uid=*/0};

  explicit CustodyHolder(FakeCustody& custody) {
    holder.adopt_holder_settings(want().holder);
    holder.attach_custody(&custody);
  }
  static Desired want(const std::string& text = kCustodyConfig) {
    return load_config(SourceFile("test.yaml", text), test::two_gpu_node(), Scope::all).desired;
  }
  std::uint64_t root() {
    Peer p;
    p.pid = 4242;
    p.user = "root";
    const std::uint64_t id = holder.connect(p);
    test::call(holder, id, {{"op", "hello"}, {"protocol", proto::kProtocol}});
    return id;
  }
  std::string custody_error() {
    const auto& e = holder.status().custody.error;
    return e ? e->message : "";
  }
};

// The size of a simulated exported allocation whose descriptor custody keeps (its memfd holds the
// allocation and one page that describes it).
std::uint64_t kept_size(const FakeCustody& custody, const std::string& name) {
  struct stat st {};
  REQUIRE(::fstat(custody.kept.at(name).get(), &st) == 0);
  return static_cast<std::uint64_t>(st.st_size) - 4096;
}

custody::ManifestBuffer manifest_buffer(const std::string& name, std::uint64_t size, std::uint64_t mapped) {
  custody::ManifestBuffer b;
  b.name = name;
  b.pool = "kv";
  b.uuid = kUuid0;
  b.size = size;
  b.parts = {size};
  b.mapped = {mapped};
  b.origin = "client";
  return b;
}

}  // namespace adopt_test

using namespace adopt_test;

TEST_CASE("custody: a buffer a reload resizes is in custody under its new allocation when apply returns") {
  FakeCustody custody;
  {
    CustodyHolder node(custody);
    node.holder.adopt({}, CustodyHolder::want());
    node.holder.apply(CustodyHolder::want());
    CHECK(kept_size(custody, "cupool-buffer.weights.0") == 2ULL << 20);
    std::string bigger = kCustodyConfig;
    bigger.replace(bigger.find("size: 2MiB"), 10, "size: 6MiB");
    const auto changes = node.holder.apply(CustodyHolder::want(bigger));
    CHECK(changes.size() == 1);
    // Before the reply: the part's name holds the new allocation, and the manifest says so.
    REQUIRE(custody.kept.count("cupool-buffer.weights.0"));
    CHECK(kept_size(custody, "cupool-buffer.weights.0") == 6ULL << 20);
    CHECK(custody.manifest().buffers.at(0).size == 6ULL << 20);
    CHECK(custody.manifest_count() == 1);
    CHECK(node.custody_error().empty());
  }  // the holder goes as a SIGKILL would leave custody
  CustodyHolder next(custody);
  const model::Adoption adopted = next.holder.adopt(custody.withdraw(), CustodyHolder::want());
  REQUIRE(adopted.buffers.size() == 1);
  CHECK(adopted.buffers[0].size_bytes == 6ULL << 20);
  CHECK(adopted.refused.empty());
}

TEST_CASE("custody: a keeper that stops answering after a change costs later requests nothing until the retry") {
  FakeCustody custody;
  CustodyHolder node(custody);
  node.holder.adopt({}, CustodyHolder::want());
  node.holder.apply(CustodyHolder::want());
  const auto root = node.root();
  node.holder.set_custody_retry_ms(300);
  custody.down = true;
  test::call(node.holder, root,
             {{"op", "buffer_create"}, {"name", "scratch"}, {"pool", "kv"}, {"size_bytes", 1 << 20}});
  CHECK(node.custody_error().find("buffer scratch could not be given to the test's keeper") != std::string::npos);
  const int calls = custody.calls;
  for (int i = 0; i < 50; ++i) test::call(node.holder, root, {{"op", "list"}});
  test::call(node.holder, root, {{"op", "buffer_create"}, {"name", "more"}, {"pool", "kv"}, {"size_bytes", 1 << 20}});
  CHECK_FALSE(node.holder.audit_custody());  // the audit too leaves it alone until the retry
  CHECK(custody.calls == calls);             // nothing asked of custody between the failure and the retry
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  CHECK_FALSE(node.holder.audit_custody());  // the retry: asked, failed
  CHECK(custody.calls == calls + 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  custody.down = false;
  CHECK(node.holder.audit_custody());
  CHECK(node.custody_error().empty());
  CHECK(custody.kept.count("cupool-buffer.scratch.0"));
  CHECK(custody.kept.count("cupool-buffer.more.0"));
  std::set<std::string> in_manifest;
  for (const auto& b : custody.manifest().buffers) in_manifest.insert(b.name);
  CHECK(in_manifest == std::set<std::string>{"more", "scratch", "weights"});
  CHECK(custody.manifest_count() == 1);
}

TEST_CASE("custody: a slow keeper holds a request up no longer than the custody budget") {
  FakeCustody custody;
  CustodyHolder node(custody);
  node.holder.adopt({}, CustodyHolder::want());
  node.holder.apply(CustodyHolder::want());
  const auto root = node.root();
  node.holder.set_custody_retry_ms(0);             // the audit below may try again at once
  custody.delay = std::chrono::milliseconds(200);  // each call; a buffer of 8 parts needs 9 and more
  Json create = {{"op", "buffer_create"}, {"name", "parts"}, {"pool", "kv"}, {"size_bytes", 8 << 20}};
  create["part_sizes_bytes"] = Json::array();
  for (int i = 0; i < 8; ++i) create["part_sizes_bytes"].push_back(1 << 20);
  const auto start = Clock::now();
  test::call(node.holder, root, create);
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK(took < (Holder::kCustodyBudgetMs + 300) / 1000.0);
  CHECK(node.custody_error().find("did not answer in the time custody has") != std::string::npos);
  // Given time, the audit gives it the rest.
  custody.delay = std::chrono::milliseconds(0);
  CHECK(node.holder.audit_custody());
  for (int i = 0; i < 8; ++i) CHECK(custody.kept.count("cupool-buffer.parts." + std::to_string(i)));
}

TEST_CASE("custody: one limit for the parts of a buffer, the manifest's") {
  FakeCustody custody;
  CustodyHolder node(custody);
  node.holder.adopt({}, CustodyHolder::want());
  node.holder.apply(CustodyHolder::want());
  const auto root = node.root();
  const auto create = [&](std::size_t parts) {
    Json request = {
        {"op", "buffer_create"}, {"name", "p" + std::to_string(parts)}, {"pool", "kv"}, {"size_bytes", parts * 4096}};
    request["part_sizes_bytes"] = Json::array();
    for (std::size_t i = 0; i < parts; ++i) request["part_sizes_bytes"].push_back(4096);
    return request;
  };
  // Before issue 34 a buffer took 4,096 parts and the manifest 1,024: one such buffer switched
  // custody off for every buffer.
  try {
    test::call(node.holder, root, create(kMaxBufferParts + 1));
    FAIL("a buffer of too many parts was made");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("1 to " + std::to_string(kMaxBufferParts)) != std::string::npos);
  }
  test::call(node.holder, root, create(kMaxBufferParts));
  CHECK(node.custody_error().empty());
  CHECK(custody.manifest().buffers.size() == 2);
  CHECK(custody.kept.count("cupool-buffer.p1024." + std::to_string(kMaxBufferParts - 1)));
  // And the next holder adopts it, each part checked against every other once (not pair by pair).
  CustodyHolder next(custody);
  const auto start = Clock::now();
  const model::Adoption adopted = next.holder.adopt(custody.withdraw(), CustodyHolder::want());
  CHECK(adopted.buffers.size() == 2);
  CHECK(adopted.refused.empty());
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 2.0);
}

TEST_CASE("custody: adoption believes nothing custody says that the node, the driver and the config can't confirm") {
  FakeCustody custody;
  SimBackend maker{test::two_gpu_node()};  // makes allocations as an earlier holder did
  const std::uint64_t granule = SimBackend::kGranule;
  const auto allocation = [&](std::uint64_t bytes) { return Fd(maker.create_exported(0, bytes).fd); };
  custody::Manifest m;
  m.sequence = 6;
  m.holder_pid = 4242;
  m.backend = "simulated";
  // A buffer in a pool the config lacks.
  m.buffers.push_back(manifest_buffer("orphan", granule, granule));
  m.buffers.back().pool = "gone";
  custody.kept["cupool-buffer.orphan.0"] = allocation(granule);
  // A part said to be a smaller allocation than custody holds.
  m.buffers.push_back(manifest_buffer("short", granule, granule));
  custody.kept["cupool-buffer.short.0"] = allocation(3 * granule);
  // A part said to be mapped at more than its granule-rounded size.
  m.buffers.push_back(manifest_buffer("wide", granule / 2, 2 * granule));
  custody.kept["cupool-buffer.wide.0"] = allocation(2 * granule);
  // One allocation under two names.
  m.buffers.push_back(manifest_buffer("first", granule, granule));
  m.buffers.push_back(manifest_buffer("twice", granule, granule));
  custody.kept["cupool-buffer.first.0"] = allocation(granule);
  custody.kept["cupool-buffer.twice.0"] = Fd(::fcntl(custody.kept["cupool-buffer.first.0"].get(), F_DUPFD_CLOEXEC, 3));
  // A good one.
  m.buffers.push_back(manifest_buffer("good", granule, granule));
  custody.kept["cupool-buffer.good.0"] = allocation(granule);
  custody.kept["cupool-manifest.6"] = custody::seal_manifest(m);
  // Junk named with the last sequence there is: it must not stop the next manifest.
  custody::Manifest junk;
  junk.sequence = 5;
  junk.holder_pid = 4242;
  junk.backend = "simulated";
  const Fd junk_fd = custody::seal_manifest(junk);
  custody.kept["cupool-manifest.18446744073709551615"] = Fd(::fcntl(junk_fd.get(), F_DUPFD_CLOEXEC, 3));

  CustodyHolder node(custody);
  const model::Adoption first = node.holder.adopt(custody.withdraw(), CustodyHolder::want());
  // Without the driver (the holder's start before cuInit), only what needs none is refused: the
  // config's pool, one allocation under two names. The driver checks the rest once it runs
  // (the holder's starter thread), and what it refuses leaves the holder and custody.
  std::vector<std::string> unchecked;
  for (const auto& b : first.buffers) unchecked.push_back(b.name);
  CHECK(unchecked == std::vector<std::string>{"short", "wide", "first", "good"});  // the manifest's order
  const std::vector<AdoptedPart> parts = node.holder.unverified();
  CHECK(parts.size() == 4);
  node.holder.settle_adoption(verify_adopted(node.sim, parts));
  CHECK(node.holder.unverified().empty());
  const model::Adoption report = *node.holder.status().custody.adoption;
  std::map<std::string, std::string> refused;
  for (const auto& r : report.refused) refused[r.name] = r.error.message;
  std::vector<std::string> adopted;
  for (const auto& b : report.buffers) adopted.push_back(b.name);
  CHECK(adopted == std::vector<std::string>{"first", "good"});
  std::vector<std::string> held;
  for (const auto& b : node.holder.status().buffers) held.push_back(b.name);
  CHECK(held == std::vector<std::string>{"first", "good"});
  CHECK(refused["orphan"].find("its pool gone on device 0") != std::string::npos);
  CHECK(refused["short"].find("does not match what custody holds") != std::string::npos);
  CHECK(refused["wide"].find("part 0 says 4194304 bytes are mapped for 1048576") != std::string::npos);
  CHECK(refused["twice"].find("cupool-buffer.twice.0 is the same allocation as cupool-buffer.first.0") !=
        std::string::npos);
  CHECK(refused.count("cupool-manifest.18446744073709551615"));
  CHECK(report.manifest_sequence == 6);
  // Custody goes on: the next manifest follows the one adopted, the junk is gone.
  CHECK(node.custody_error().empty());
  CHECK(custody.kept.count("cupool-manifest.8"));  // 7 of what was adopted, 8 without what the driver refused
  CHECK(custody.manifest_count() == 1);
  CHECK_FALSE(custody.kept.count("cupool-buffer.orphan.0"));
  CHECK_FALSE(custody.kept.count("cupool-buffer.short.0"));
  CHECK_FALSE(custody.kept.count("cupool-buffer.wide.0"));
  CHECK(custody.kept.count("cupool-buffer.first.0"));
}

TEST_CASE("custody: a request that fails after changing what custody keeps still leaves custody synced") {
  FakeCustody custody;
  CustodyHolder node(custody);
  node.holder.adopt({}, CustodyHolder::want());
  node.holder.apply(CustodyHolder::want());
  REQUIRE(custody.kept.count("cupool-buffer.weights.0"));
  REQUIRE(custody.manifest().buffers.size() == 1);
  const auto root = node.root();
  // The new config drops the buffer (removed first) and adds a pool the driver refuses: the apply
  // request throws after the buffer went.
  const std::string without_buffer = R"(version: 1
holder: {socket: /tmp/cupool-unit.sock, mode: "0666"}
pools:
  - {name: kv, devices: [0], handle_types: [posix_fd], max_size: 4GiB}
  - {name: other, devices: [1], handle_types: [posix_fd]}
)";
  node.sim.fail("create_pool", "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK_THROWS(test::call(node.holder, root, {{"op", "apply"}, {"config", without_buffer}}));
  // The reply was an error, yet custody heard of the change before it: a new manifest without the
  // buffer, and its part no longer kept.
  CHECK(node.custody_error().empty());
  CHECK(custody.manifest().buffers.empty());
  CHECK(custody.manifest_count() == 1);
  CHECK_FALSE(custody.kept.count("cupool-buffer.weights.0"));
  CHECK(node.holder.status().buffers.empty());
}
