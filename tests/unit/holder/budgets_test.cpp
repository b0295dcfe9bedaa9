// Budgets and the ledger (holder/budgets.h, holder/budget_requests.h) on a simulated node: grants
// that fit and refusals that quote the ledger, claims bound to a process tree and a connection,
// grants given back when the connection or the process ends, and the ledger's arithmetic.
#include "holder/budgets.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>

#include "config/load.h"
#include "device/sim_backend.h"
#include "holder/holder.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/holder/requests.h"

using namespace cupool;

namespace {

const char* const kConfig = R"(version: 1
holder: {socket: /tmp/cupool-unit.sock, mode: "0666"}
pools:
  - name: kv
    devices: [0, 1]
    handle_types: [posix_fd]
    max_size: 1GiB
    release_threshold: max
    reserve: 64MiB
buffers:
  - {name: weights, pool: kv, device: 0, size: 128MiB}
)";

constexpr std::uint64_t kGiB = 1ULL << 30;
constexpr std::uint64_t kContext = 768ULL << 20;

struct BudgetsFixture {
  SimBackend sim{test::two_gpu_node()};
  Holder holder{sim, test::two_gpu_node(), /*self_uid=*/1000};

  BudgetsFixture() {
    const Desired want = load_config(SourceFile("test.yaml", kConfig), test::two_gpu_node(), Scope::all).desired;
    holder.adopt_holder_settings(want.holder);
    holder.apply(want);
  }
  std::uint64_t client(int pid, std::uint32_t uid = 1000) {
    Peer p;
    p.pid = pid;
    p.uid = uid;
    p.gid = uid;
    p.user = uid == 1000 ? "alice" : "bob";
    const std::uint64_t id = holder.connect(p);
    call(id, {{"op", "hello"}, {"protocol", proto::kProtocol}});
    return id;
  }
  Json call(std::uint64_t id, Json req) { return test::call(holder, id, std::move(req)); }
  std::string error_code(std::uint64_t id, Json req) { return test::error_code(holder, id, std::move(req)); }
  std::string error_message(std::uint64_t id, Json req) {
    try {
      call(id, std::move(req));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  static Json grant(std::uint64_t bytes, int device = 0) {
    return {{"op", "budget_grant"}, {"devices", Json::array({{{"device", device}, {"budget_bytes", bytes}}})}};
  }
  model::LedgerDevice device(int d = 0) { return holder.ledger().devices.at(static_cast<std::size_t>(d)); }
};

}  // namespace

TEST_CASE("a budget that fits is granted; one that does not is refused with the ledger's figures") {
  BudgetsFixture f;
  const model::LedgerDevice empty = f.device();
  CHECK(empty.total_bytes == 80 * kGiB);
  CHECK(empty.held_bytes >= 128ULL << 20);
  CHECK(empty.buffers.size() == 1);
  CHECK(empty.pool_reserved_bytes >= 64ULL << 20);
  CHECK(empty.context_bytes == kContext);  // the holder's own: it holds memory on device 0
  CHECK(empty.committed_bytes == empty.held_bytes + empty.pool_reserved_bytes + kContext);
  CHECK(empty.available_bytes == empty.total_bytes - empty.committed_bytes);

  const std::uint64_t exec = f.client(::getpid());
  const Json g = f.call(exec, BudgetsFixture::grant(10 * kGiB));
  CHECK(g["grant"].get<std::string>().rfind("b1-", 0) == 0);
  CHECK(g["devices"][0]["budget_bytes"] == 10 * kGiB);
  CHECK(g["devices"][0]["uuid"] == "GPU-00000000-0000-4000-8000-000000000000");
  const model::LedgerDevice one = f.device();
  REQUIRE(one.budgets.size() == 1);
  CHECK_FALSE(one.budgets[0].claimed);
  CHECK(one.budgets[0].pid == ::getpid());
  CHECK(one.budget_bytes == 10 * kGiB);
  CHECK(one.committed_bytes == empty.committed_bytes + 10 * kGiB + kContext);

  // Exactly what is left fits; a byte more does not, and the refusal says where the memory went.
  const std::uint64_t left = one.available_bytes - kContext;
  const std::string refusal = f.error_message(exec, BudgetsFixture::grant(left + 1));
  CHECK(refusal.find("does not fit device 0") != std::string::npos);
  CHECK(refusal.find("10 GiB granted to 1 process") != std::string::npos);
  CHECK(refusal.find("held in 1 buffer") != std::string::npos);
  CHECK(refusal.find("cupool ledger") != std::string::npos);
  CHECK(f.error_code(exec, BudgetsFixture::grant(left + 1)) == "out_of_memory");
  CHECK(f.error_code(exec, BudgetsFixture::grant(left)) == "ok");
  CHECK(f.device().available_bytes == 0);
  // Device 1 is another account.
  CHECK(f.error_code(exec, BudgetsFixture::grant(kGiB, 1)) == "ok");
}

TEST_CASE("a budget request is checked before anything is granted") {
  BudgetsFixture f;
  const std::uint64_t exec = f.client(::getpid());
  CHECK(f.error_code(exec, BudgetsFixture::grant(81 * kGiB)) == "bad_request");  // larger than the device
  CHECK(f.error_message(exec, BudgetsFixture::grant(80 * kGiB)).find("larger than device 0") != std::string::npos);
  CHECK(f.error_code(exec, BudgetsFixture::grant(kGiB, 7)) == "not_found");
  CHECK(f.error_code(exec, {{"op", "budget_grant"}, {"devices", Json::array()}}) == "bad_request");
  CHECK(f.error_code(exec, {{"op", "budget_grant"}}) == "bad_request");
  CHECK(f.error_code(exec, {{"op", "budget_grant"},
                            {"devices", Json::array({{{"device", 0}, {"budget_bytes", 1}, {"budget_percent", 5}}})}}) ==
        "bad_request");
  CHECK(f.error_code(exec, {{"op", "budget_grant"}, {"devices", Json::array({{{"device", 0}}})}}) == "bad_request");
  CHECK(f.error_code(exec, {{"op", "budget_grant"},
                            {"devices", Json::array({{{"device", 0}, {"budget_percent", 0}}})}}) == "bad_request");
  CHECK(f.error_code(exec, {{"op", "budget_grant"},
                            {"devices", Json::array({{{"device", 0}, {"budget_percent", 100.5}}})}}) == "bad_request");
  CHECK(f.error_code(exec, {{"op", "budget_grant"},
                            {"devices", Json::array({{{"device", 0}, {"budget_bytes", kGiB}, {"colour", "red"}}})}}) ==
        "bad_request");
  CHECK(f.error_code(exec, {{"op", "budget_grant"},
                            {"devices", Json::array({{{"device", 0}, {"budget_bytes", kGiB}},
                                                     {{"device", 0}, {"budget_bytes", kGiB}}})}}) == "bad_request");
  CHECK(f.holder.ledger().devices[0].budgets.empty());  // none of those granted anything
  // A percentage is of the device's memory.
  const Json g =
      f.call(exec, {{"op", "budget_grant"}, {"devices", Json::array({{{"device", 1}, {"budget_percent", 12.5}}})}});
  CHECK(g["devices"][0]["budget_bytes"] == 10 * kGiB);
  // Several devices: all or nothing.
  CHECK(f.error_code(exec, {{"op", "budget_grant"},
                            {"devices", Json::array({{{"device", 0}, {"budget_bytes", kGiB}},
                                                     {{"device", 1}, {"budget_bytes", 79 * kGiB}}})}}) != "ok");
  CHECK(f.holder.ledger().devices[0].budgets.empty());
}

TEST_CASE(
    "a process of the command claims the grant; its use shows in the ledger; its connection ending gives it back") {
  BudgetsFixture f;
  const std::uint64_t exec = f.client(::getpid());
  const std::string id = f.call(exec, BudgetsFixture::grant(4 * kGiB))["grant"].get<std::string>();
  const Json claim = {{"op", "budget_claim"}, {"grant", id}};
  // Another user, or a process outside the tree, may not have it.
  CHECK(f.error_code(f.client(::getpid(), 2000), claim) == "not_permitted");
  CHECK(f.error_code(f.client(1), claim) == "not_permitted");
  CHECK(f.error_code(f.client(::getpid()), {{"op", "budget_claim"}, {"grant", "b9-0000"}}) == "not_found");
  // A usage report before a claim has nowhere to go.
  const std::uint64_t engine = f.client(::getpid());
  const Json usage = {{"op", "budget_usage"},
                      {"devices", Json::array({{{"uuid", "GPU-00000000-0000-4000-8000-000000000000"},
                                                {"used_bytes", 3 * kGiB},
                                                {"peak_bytes", 3 * kGiB + 5}}})}};
  CHECK(f.error_code(engine, usage) == "not_found");
  const Json claimed = f.call(engine, claim);
  CHECK(claimed["devices"][0]["budget_bytes"] == 4 * kGiB);
  CHECK(f.error_code(f.client(::getpid()), claim) == "busy");  // one process holds it
  CHECK(f.error_code(engine, claim) == "busy");
  f.call(engine, usage);
  model::LedgerBudget b = f.device().budgets.at(0);
  CHECK(b.claimed);
  CHECK(b.used_bytes == 3 * kGiB);
  CHECK(b.peak_bytes == 3 * kGiB + 5);
  CHECK(f.device().budget_used_bytes == 3 * kGiB);
  CHECK(f.error_code(engine, {{"op", "budget_usage"},
                              {"devices", Json::array({{{"uuid", "GPU-00000000-0000-4000-8000-000000000001"},
                                                        {"used_bytes", 1},
                                                        {"peak_bytes", 1}}})}}) == "bad_request");
  // exec's own connection closing changes nothing (it always closes before the command runs).
  f.holder.disconnect(exec);
  CHECK(f.device().budgets.size() == 1);
  // The claimer's does (a SIGKILL closes it too).
  f.holder.disconnect(engine);
  CHECK(f.device().budgets.empty());
  CHECK(f.device().budget_bytes == 0);
}

TEST_CASE("a grant nobody claimed ends with the process it was made for") {
  BudgetsFixture f;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  const std::uint64_t exec = f.client(child);
  f.call(exec, BudgetsFixture::grant(kGiB));
  f.holder.expire_budgets();
  CHECK(f.device().budgets.size() == 1);  // still running
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  f.holder.expire_budgets();
  CHECK(f.device().budgets.empty());
}

TEST_CASE("the ledger counts the processes cupool does not know, and NVML's figures beside its own") {
  BudgetsFixture f;
  f.sim.add_gpu_process(0, GpuProcess{999999, 2 * kGiB});
  f.sim.add_gpu_process(0, GpuProcess{999998, std::nullopt});
  const model::LedgerDevice d = f.device();
  CHECK(d.usage_source == "simulated");
  REQUIRE(d.memory.has_value());
  CHECK(d.unknown_bytes == 2 * kGiB);
  CHECK(d.committed_bytes == d.held_bytes + d.pool_reserved_bytes + d.context_bytes + 2 * kGiB);
  int unknown = 0, holder = 0;
  for (const model::LedgerProcess& p : d.processes) {
    unknown += p.role == "unknown";
    holder += p.role == "holder" && p.pid == ::getpid();
  }
  CHECK(unknown == 2);
  CHECK(holder == 1);
  // The simulated node's used memory is its reserve, the holder's memory and context, and the
  // strangers': the ledger explains all of it.
  REQUIRE(d.accounted_bytes.has_value());
  REQUIRE(d.unexplained_bytes.has_value());
  CHECK(*d.unexplained_bytes == 0);
  // A budget does not fit around a stranger's memory.
  const std::uint64_t exec = f.client(::getpid());
  // A granted budget whose process NVML does not list uses nothing on the device yet: the ledger
  // still explains every byte (it once counted such a budget's context, and went negative).
  const std::uint64_t other = f.client(1);  // a process of its own (this one is the holder's too)
  f.call(other, BudgetsFixture::grant(kGiB));
  f.call(other, BudgetsFixture::grant(kGiB));
  CHECK(*f.device().unexplained_bytes == 0);
  CHECK(f.error_message(exec, BudgetsFixture::grant(d.available_bytes))
            .find("used by 2 processes cupool does not know") != std::string::npos);
}

TEST_CASE("a user who is not an admin sees only their own command lines, and holds at most so many grants") {
  BudgetsFixture f;
  const std::uint64_t admin = f.client(1);  // uid 1000: the holder's user
  Json g = BudgetsFixture::grant(kGiB);
  g["command"] = "serve --token secret";
  f.call(admin, g);
  const std::uint64_t bob = f.client(1, 2000);
  const Json seen_by_bob = f.call(bob, {{"op", "ledger"}});
  CHECK(seen_by_bob["devices"][0]["budgets"][0]["command"] == "");
  CHECK(seen_by_bob["devices"][0]["budgets"][0]["user"] == "alice");
  CHECK(f.call(admin, {{"op", "ledger"}})["devices"][0]["budgets"][0]["command"] == "serve --token secret");
  CHECK(f.call(bob, {{"op", "stats"}})["ledger"]["devices"][0]["budgets"][0]["command"] == "");
  for (std::size_t i = 0; i < BudgetRequests::kMaxGrantsPerUser; ++i)
    REQUIRE(f.error_code(bob, BudgetsFixture::grant(1 << 20)) == "ok");
  CHECK(f.error_code(bob, BudgetsFixture::grant(1 << 20)) == "limit_exceeded");
  CHECK(f.error_code(admin, BudgetsFixture::grant(1 << 20)) == "ok");  // an admin is not held to it
}

TEST_CASE("where the kernel has the dmem controller, a grant is its cgroup's dmem.max too") {
  BudgetsFixture f;
  // A cgroup tree of this process's own cgroup path, under a root CUPOOL_CGROUP_ROOT names.
  std::ifstream self("/proc/self/cgroup");
  std::string line, cgroup;
  while (std::getline(self, line))
    if (line.rfind("0::", 0) == 0) cgroup = line.substr(3);
  const std::string root = test::temp_path("cgroup");
  ::mkdir(root.c_str(), 0700);
  std::ofstream(root + "/cgroup.controllers") << "cpu memory dmem\n";
  std::ofstream(root + "/dmem.capacity") << "drm/0000:1b:00.0/vram0 85899345920\n";
  std::string dir = root;
  for (std::size_t at = 1; at < cgroup.size();) {
    const std::size_t end = std::min(cgroup.find('/', at), cgroup.size());
    dir += "/" + cgroup.substr(at, end - at);
    ::mkdir(dir.c_str(), 0700);
    at = end + 1;
  }
  std::ofstream(dir + "/cgroup.procs") << ::getpid() << "\n";
  std::ofstream(dir + "/dmem.max") << "";
  ::setenv("CUPOOL_CGROUP_ROOT", root.c_str(), 1);
  const std::uint64_t exec = f.client(::getpid());
  const Json g = f.call(exec, BudgetsFixture::grant(3 * kGiB));
  const std::string kernel = g["devices"][0]["kernel_limit"].get<std::string>();
  if (cgroup.empty() || cgroup == "/") {
    CHECK(kernel.find("root cgroup") != std::string::npos);  // no dmem.max there to write
  } else {
    CHECK(kernel == "dmem.max drm/0000:1b:00.0/vram0 3221225472");
    std::ifstream written(dir + "/dmem.max");
    const std::string text((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
    CHECK(text == "drm/0000:1b:00.0/vram0 3221225472\n");
    // A cgroup of other processes too is left alone: a limit there would bind them all.
    std::ofstream(dir + "/cgroup.procs") << ::getpid() << "\n1\n";
    const std::string shared =
        f.call(exec, BudgetsFixture::grant(kGiB))["devices"][0]["kernel_limit"].get<std::string>();
    CHECK(shared.find("holds 1 other process") != std::string::npos);
  }
  // No region for device 1, and no controller at all: said, and the grant stands.
  CHECK(f.call(exec, BudgetsFixture::grant(kGiB, 1))["devices"][0]["kernel_limit"] ==
        "not set: no dmem region for 0000:2b:00.0");
  std::ofstream(root + "/cgroup.controllers") << "cpu memory\n";
  CHECK(f.call(exec, BudgetsFixture::grant(kGiB, 1))["devices"][0]["kernel_limit"].get<std::string>().find(
            "not set: the kernel has no dmem cgroup controller") == 0);
  ::unsetenv("CUPOOL_CGROUP_ROOT");
}

TEST_CASE("descends_from follows the parents /proc names, past a command with a parenthesis") {
  const std::string proc = test::temp_path("proc");
  ::mkdir(proc.c_str(), 0700);
  auto stat = [&](int pid, const std::string& command, int parent) {
    const std::string dir = proc + "/" + std::to_string(pid);
    ::mkdir(dir.c_str(), 0700);
    std::ofstream(dir + "/stat") << pid << " (" << command << ") S " << parent << " 1 1 0 -1\n";
  };
  stat(10, "python3) S 7", 5);  // a command may hold ") S 7": the last ')' ends it
  stat(5, "sh", 2);
  stat(2, "init", 1);
  CHECK(descends_from(10, 5, proc));
  CHECK(descends_from(10, 2, proc));
  CHECK(descends_from(10, 10, proc));
  CHECK_FALSE(descends_from(10, 7, proc));
  CHECK_FALSE(descends_from(5, 10, proc));
  CHECK_FALSE(descends_from(11, 5, proc));  // no such process
}
