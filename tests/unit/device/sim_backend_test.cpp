#include "device/sim_backend.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/fd.h"
#include "device/query.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

TEST_CASE("query asks attributes only, and records each call") {
  SimBackend sim(test::two_gpu_node());
  const NodeReport r = build_report(sim);
  CHECK(r.devices.size() == 2);
  CHECK(r.source.simulated);
  const std::vector<std::string> expected{
      "init()",         "driver_version()",     "kernel_driver_version()", "host_numa_nodes()",
      "device_count()", "device_info(0)",       "memory_info(0)",          "device_info(1)",
      "memory_info(1)", "can_access_peer(0,1)", "can_access_peer(1,0)"};
  CHECK(sim.calls() == expected);
}

TEST_CASE("--deep probes every handle type on every selected device") {
  NodeReport node = test::two_gpu_node();
  node.devices[1].info.pool_handle_types = 0x1;  // no fabric
  SimBackend sim(node);
  QueryOptions o;
  o.deep = true;
  o.devices = {*parse_device_selector("1")};
  const NodeReport r = build_report(sim, o);
  REQUIRE(r.devices.size() == 1);
  CHECK(r.devices[0].info.ordinal == 1);
  CHECK(r.peer_access == std::vector<std::vector<bool>>{{true}});
  REQUIRE(r.devices[0].probes.size() == 3);
  CHECK(r.devices[0].probes[1].ok);
  CHECK_FALSE(r.devices[0].probes[2].ok);
  CHECK(r.devices[0].probes[2].error == "CUDA_ERROR_NOT_SUPPORTED");
  CHECK(sim.calls().back() == "probe_export(1,fabric)");
}

TEST_CASE("--deep asks about GPUDirect Storage once, and only when asked to") {
  SimBackend sim(test::two_gpu_node());
  QueryOptions o;
  o.deep = true;
  const NodeReport r = build_report(sim, o);
  REQUIRE(r.gds);
  CHECK(r.gds->mode == GdsReport::Mode::unavailable);  // the profile records none
  CHECK(r.gds->reason.find("profile records no GPUDirect Storage") != std::string::npos);
  CHECK(std::count(sim.calls().begin(), sim.calls().end(), "gds_report()") == 1);

  SimBackend quiet(test::two_gpu_node());
  o.gds = false;  // check --deep
  CHECK_FALSE(build_report(quiet, o).gds);
  CHECK(std::count(quiet.calls().begin(), quiet.calls().end(), "gds_report()") == 0);
  CHECK_FALSE(build_report(quiet).gds);  // nor without --deep
}

TEST_CASE("recorded probes are the node's answer") {
  NodeReport node = test::two_gpu_node();
  node.devices[0].probes.push_back(
      {HandleType::fabric, false, "CUDA_ERROR_NOT_PERMITTED", "cuMemPoolExportToShareableHandle", "no IMEX", ""});
  SimBackend sim(node);
  const ExportProbe p = sim.probe_export(0, HandleType::fabric);
  CHECK_FALSE(p.ok);
  CHECK(p.error == "CUDA_ERROR_NOT_PERMITTED");
}

TEST_CASE("failure injection") {
  SUBCASE("no device at init is a NoDriverError") {
    SimBackend sim(test::two_gpu_node());
    sim.fail("init", "CUDA_ERROR_NO_DEVICE");
    CHECK_THROWS_AS(build_report(sim), NoDriverError);
  }
  SUBCASE("a failing attribute query is a CudaError naming the call") {
    SimBackend sim(test::two_gpu_node());
    sim.fail("device_info", "CUDA_ERROR_UNKNOWN");
    try {
      build_report(sim);
      FAIL("expected CudaError");
    } catch (const CudaError& e) {
      CHECK(e.name() == "CUDA_ERROR_UNKNOWN");
      CHECK(e.result() == 999);
      CHECK(e.code() == Errc::cuda);
      CHECK(std::string(e.what()).find("device_info") != std::string::npos);
    }
  }
  SUBCASE("a node without devices") {
    NodeReport empty = test::two_gpu_node();
    empty.devices.clear();
    empty.peer_access.clear();
    SimBackend sim(empty);
    CHECK_THROWS_AS(build_report(sim), NoDriverError);
  }
  SUBCASE("an invalid ordinal is the driver's INVALID_DEVICE") {
    SimBackend sim(test::two_gpu_node());
    CHECK_THROWS_AS(sim.device_info(5), CudaError);
  }
}

TEST_CASE("a device selector that names no device is an input error") {
  SimBackend sim(test::two_gpu_node());
  QueryOptions o;
  o.devices = {*parse_device_selector("GPU-99999999-0000-4000-8000-000000000000")};
  CHECK_THROWS_AS(build_report(sim, o), InputError);
}

TEST_CASE("simulated pools: threshold, trim, peaks, limits") {
  SimBackend sim(test::two_gpu_node());
  const std::uint64_t mib = 1ULL << 20;
  PoolProps props;
  props.handle_types = 0x1;
  props.max_size = 256 * mib;
  const PoolHandle pool = sim.create_pool(0, props);
  CHECK(sim.pool_settings(pool).release_threshold.bytes() == 0);

  std::uint64_t p = sim.allocate(pool, 3 * mib);
  CHECK(sim.pool_usage(pool).used_bytes == 3 * mib);
  CHECK(sim.pool_usage(pool).reserved_bytes == 4 * mib);  // 2 MiB granules
  sim.free(pool, p);
  CHECK(sim.pool_usage(pool).reserved_bytes == 0);  // threshold 0: released at the synchronize

  PoolSettings keep;
  keep.release_threshold = ReleaseThreshold::max();
  sim.set_pool_settings(pool, keep);
  p = sim.allocate(pool, 64 * mib);
  sim.free(pool, p);
  CHECK(sim.pool_usage(pool).reserved_bytes == 64 * mib);
  sim.trim_pool(pool, 16 * mib);
  CHECK(sim.pool_usage(pool).reserved_bytes == 32 * mib);  // whole 32 MiB chunks, as the driver does
  sim.trim_pool(pool, 0);
  CHECK(sim.pool_usage(pool).reserved_bytes == 0);
  CHECK(sim.pool_usage(pool).reserved_peak_bytes == 64 * mib);
  sim.reset_pool_peaks(pool);
  CHECK(sim.pool_usage(pool).reserved_peak_bytes == 0);

  // A threshold in between keeps that much.
  keep.release_threshold = ReleaseThreshold(10 * mib);
  sim.set_pool_settings(pool, keep);
  p = sim.allocate(pool, 64 * mib);
  sim.free(pool, p);
  CHECK(sim.pool_usage(pool).reserved_bytes == 10 * mib);

  // Sizes near 2^64 saturate instead of wrapping around.
  CHECK_THROWS_AS(sim.allocate(pool, UINT64_MAX), CudaError);
  CHECK_THROWS_AS(sim.allocate(pool, UINT64_MAX - mib), CudaError);
  const std::uint64_t before = sim.pool_usage(pool).reserved_bytes;
  sim.trim_pool(pool, UINT64_MAX);
  CHECK(sim.pool_usage(pool).reserved_bytes == before);

  // Limits and misuse are the driver's errors.
  CHECK_THROWS_AS(sim.allocate(pool, 512 * mib), CudaError);  // above max_size
  CHECK_THROWS_AS(sim.free(pool, 0xdead), CudaError);
  CHECK_THROWS_AS(sim.pool_usage(pool + 100), CudaError);
  sim.set_pool_access(pool, 1);
  sim.destroy_pool(pool);
  CHECK_THROWS_AS(sim.pool_usage(pool), CudaError);
}

TEST_CASE("simulated pools follow the node: support, handle types, peers, free memory") {
  NodeReport node = test::two_gpu_node();
  node.devices[1].info.memory_pools = false;
  node.devices[0].info.pool_handle_types = 0x1;
  node.peer_access[1][0] = false;
  node.devices[0].memory->free = 8ULL << 20;
  SimBackend sim(node);
  PoolProps fabric;
  fabric.handle_types = 0x8;
  CHECK_THROWS_AS(sim.create_pool(0, fabric), CudaError);
  CHECK_THROWS_AS(sim.create_pool(1, PoolProps{}), CudaError);
  PoolProps host;
  host.location = PoolProps::Location::host;
  host.handle_types = 0x1;
  CHECK_THROWS_AS(sim.create_pool(0, host), CudaError);
  const PoolHandle pool = sim.create_pool(0, PoolProps{});
  CHECK_THROWS_AS(sim.set_pool_access(pool, 1), CudaError);
  CHECK_THROWS_AS(sim.allocate(pool, 16ULL << 20), CudaError);  // more than the device has free
  sim.fail("allocate", "CUDA_ERROR_OUT_OF_MEMORY");
  try {
    sim.allocate(pool, 1);
    FAIL("expected the injected failure");
  } catch (const CudaError& e) {
    CHECK(e.name() == "CUDA_ERROR_OUT_OF_MEMORY");
  }
}

// ---- the arena and sharing ----

namespace {

constexpr std::uint64_t kMiB = 1ULL << 20;

PoolProps ipc_pool(std::uint64_t max_size = 0) {
  PoolProps props;
  props.handle_types = static_cast<std::uint32_t>(HandleType::posix_fd);
  props.max_size = max_size;
  return props;
}

std::vector<std::uint8_t> pattern(std::size_t bytes, std::uint8_t seed) {
  std::vector<std::uint8_t> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::uint8_t>((i * 131 + seed) & 0xff);
  return data;
}

void expect_error(const std::function<void()>& call, const std::string& api, const std::string& name) {
  try {
    call();
    FAIL("expected a CudaError from " << api);
  } catch (const CudaError& e) {
    CHECK(e.api() == api);
    CHECK(e.name() == name);
  }
}

}  // namespace

TEST_CASE("simulated pools hand out addresses from an arena, first fit, and reuse freed ranges") {
  SimBackend sim(test::two_gpu_node());
  const PoolHandle pool = sim.create_pool(0, ipc_pool(8 * kMiB));
  const std::uint64_t a = sim.allocate(pool, 1);
  const std::uint64_t b = sim.allocate(pool, 3 * kMiB);  // two granules
  CHECK((a >> SimBackend::kAddressBits) == pool);
  CHECK(b - a == 2 * kMiB);
  sim.free(pool, a);
  const std::uint64_t c = sim.allocate(pool, 2 * kMiB);
  CHECK(c == a);  // the freed range comes back first
  // 6 MiB of the 8 are in use; the remaining 2 MiB fit one more granule and no more.
  const std::uint64_t d = sim.allocate(pool, kMiB);
  CHECK(d == b + 4 * kMiB);
  expect_error([&] { sim.allocate(pool, 1); }, "cuMemAllocFromPoolAsync", "CUDA_ERROR_OUT_OF_MEMORY");
  sim.free(pool, b);
  sim.free(pool, c);
  // Freed neighbours merge: 6 MiB in one piece at the start.
  CHECK(sim.allocate(pool, 6 * kMiB) == a);
  CHECK(sim.pool_usage(pool).used_bytes == 7 * kMiB);

  // A pool without max_size spans the device's memory; two pools never share addresses.
  const PoolHandle big = sim.create_pool(0, PoolProps{});
  const std::uint64_t e = sim.allocate(big, 64 * kMiB);
  CHECK((e >> SimBackend::kAddressBits) == big);
  CHECK(e != a);
}

TEST_CASE("simulated pools: max_size is still the limit, arena or not") {
  SimBackend sim(test::two_gpu_node());
  const PoolHandle pool = sim.create_pool(0, ipc_pool(4 * kMiB));
  const std::uint64_t a = sim.allocate(pool, 4 * kMiB);
  expect_error([&] { sim.allocate(pool, 1); }, "cuMemAllocFromPoolAsync", "CUDA_ERROR_OUT_OF_MEMORY");
  expect_error([&] { sim.allocate(pool, 64 * kMiB); }, "cuMemAllocFromPoolAsync", "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(sim.pool_usage(pool).used_bytes == 4 * kMiB);  // failures change nothing
  sim.free(pool, a);
  CHECK(sim.allocate(pool, 4 * kMiB) == a);
}

TEST_CASE("write and read reach an allocation of any own pool, and nothing else") {
  SimBackend sim(test::two_gpu_node());
  const PoolHandle plain = sim.create_pool(0, PoolProps{});
  const std::uint64_t a = sim.allocate(plain, 3 * kMiB);
  const auto data = pattern(3 * kMiB, 7);
  sim.write(0, a, data.data(), data.size());
  std::vector<std::uint8_t> back(kMiB);
  sim.read(0, a + kMiB, back.data(), back.size());
  CHECK(std::equal(back.begin(), back.end(), data.begin() + static_cast<std::ptrdiff_t>(kMiB)));
  std::uint8_t byte = 0;
  // Past the allocation's end (inside its granule), before any allocation, in no pool.
  expect_error([&] { sim.read(0, a + 3 * kMiB, &byte, 1); }, "cuMemcpyDtoH", "CUDA_ERROR_INVALID_VALUE");
  expect_error([&] { sim.write(0, a + kMiB, data.data(), data.size()); }, "cuMemcpyHtoD", "CUDA_ERROR_INVALID_VALUE");
  expect_error([&] { sim.read(0, 0xdead, &byte, 1); }, "cuMemcpyDtoH", "CUDA_ERROR_INVALID_VALUE");
  sim.free(plain, a);
  expect_error([&] { sim.read(0, a, &byte, 1); }, "cuMemcpyDtoH", "CUDA_ERROR_INVALID_VALUE");
  CHECK(sim.calls().back() == "read(0,1)");
}

TEST_CASE("export_pool_fd needs a posix_fd pool; the fd is a new one each time") {
  SimBackend sim(test::two_gpu_node());
  const PoolHandle plain = sim.create_pool(0, PoolProps{});
  expect_error([&] { sim.export_pool_fd(plain); }, "cuMemPoolExportToShareableHandle", "CUDA_ERROR_INVALID_VALUE");
  expect_error([&] { sim.allocate_shared(plain, kMiB, Backend::Readiness::event); }, "cuMemPoolExportPointer",
               "CUDA_ERROR_INVALID_VALUE");
  CHECK(sim.pool_usage(plain).used_bytes == 0);

  const PoolHandle ipc = sim.create_pool(0, ipc_pool(64 * kMiB));
  const int fd1 = sim.export_pool_fd(ipc);
  const int fd2 = sim.export_pool_fd(ipc);
  CHECK(fd1 >= 0);
  CHECK(fd2 >= 0);
  CHECK(fd1 != fd2);
  struct stat st;
  REQUIRE(::fstat(fd1, &st) == 0);
  CHECK(static_cast<std::uint64_t>(st.st_size) == 64 * kMiB);
  // A pool user holds this descriptor: it may not resize the pool under everyone's mappings.
  CHECK(::ftruncate(fd1, 0) != 0);
  CHECK(::ftruncate(fd1, static_cast<off_t>(128 * kMiB)) != 0);
  CHECK(::fcntl(fd1, F_ADD_SEALS, F_SEAL_WRITE) != 0);
  REQUIRE(::fstat(fd1, &st) == 0);
  CHECK(static_cast<std::uint64_t>(st.st_size) == 64 * kMiB);
  ::close(fd1);
  ::close(fd2);
  CHECK_THROWS_AS(sim.export_pool_fd(ipc + 100), CudaError);
}

TEST_CASE("a shared allocation is written by another process and read back") {
  SimBackend holder(test::two_gpu_node());
  const PoolHandle pool = holder.create_pool(0, ipc_pool(256 * kMiB));
  holder.allocate(pool, 2 * kMiB);  // so the shared allocation has a nonzero offset
  const SharedAllocation shared = holder.allocate_shared(pool, 4 * kMiB, Backend::Readiness::event);
  const Blob64 ready = holder.ready_event(0);
  const int fd = holder.export_pool_fd(pool);
  REQUIRE(fd >= 0);
  const auto data = pattern(4 * kMiB, 42);

  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The client: its own backend from an empty profile, nothing of the holder's but the fd and
    // the two blobs. Exit codes say which step failed.
    int step = 10;
    try {
      SimBackend client{NodeReport{}};
      const PoolHandle imported = client.import_pool_fd(0, fd);
      step = 11;
      const std::uint64_t address = client.import_pointer(imported, shared.export_data);
      step = 12;
      client.wait_ready(0, ready);
      step = 13;
      client.set_pool_access(imported, 1);  // no profile here: taken on trust
      client.write(0, address, data.data(), data.size());
      step = 14;
      client.free_imported(imported, address);
      step = 15;
      client.destroy_pool(imported);
    } catch (...) {
      ::_exit(step);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE_MESSAGE(WIFEXITED(status), "the client process died (status " << status << ")");
  REQUIRE_MESSAGE(WEXITSTATUS(status) == 0, "the client failed at step " << WEXITSTATUS(status));

  // A second importer in this process sees what the client wrote...
  {
    SimBackend importer{NodeReport{}};
    const PoolHandle imported = importer.import_pool_fd(0, fd);
    const std::uint64_t address = importer.import_pointer(imported, shared.export_data);
    importer.wait_ready(0, ready);
    std::vector<std::uint8_t> back(data.size());
    importer.read(0, address, back.data(), back.size());
    CHECK(back == data);
    importer.free_imported(imported, address);
    expect_error([&] { importer.free_imported(imported, address); }, "cuMemFreeAsync", "CUDA_ERROR_INVALID_VALUE");
    expect_error([&] { importer.read(0, address, back.data(), 1); }, "cuMemcpyDtoH", "CUDA_ERROR_INVALID_VALUE");
    const std::vector<std::string> tail{"import_pool_fd(0)", "import_pointer(1)", "wait_ready(0)", "read(0,4194304)",
                                        "free_imported(1)",  "free_imported(1)",  "read(0,1)"};
    CHECK(importer.calls() == tail);
  }
  // ...and so does the holder through its own address.
  std::vector<std::uint8_t> back(data.size());
  holder.read(0, shared.address, back.data(), back.size());
  CHECK(back == data);
  ::close(fd);
  holder.free_shared(pool, shared.address);
  holder.synchronize(0);
}

TEST_CASE("free_shared leaves the memory reserved until synchronize") {
  SimBackend sim(test::two_gpu_node());
  const PoolHandle pool = sim.create_pool(0, ipc_pool(256 * kMiB));
  const PoolHandle other = sim.create_pool(1, ipc_pool(256 * kMiB));
  const SharedAllocation a = sim.allocate_shared(pool, 3 * kMiB, Backend::Readiness::event);
  const SharedAllocation b = sim.allocate_shared(other, 8 * kMiB, Backend::Readiness::event);
  CHECK(sim.pool_usage(pool).used_bytes == 3 * kMiB);
  CHECK(sim.pool_usage(pool).reserved_bytes == 4 * kMiB);
  // A shared allocation is freed with free_shared, a plain one with free.
  expect_error([&] { sim.free(pool, a.address); }, "cuMemFreeAsync", "CUDA_ERROR_INVALID_VALUE");
  const std::uint64_t plain = sim.allocate(pool, kMiB);
  expect_error([&] { sim.free_shared(pool, plain); }, "cuMemFreeAsync", "CUDA_ERROR_INVALID_VALUE");
  sim.free(pool, plain);

  sim.free_shared(pool, a.address);
  sim.free_shared(other, b.address);
  CHECK(sim.pool_usage(pool).used_bytes == 0);
  CHECK(sim.pool_usage(pool).reserved_bytes == 4 * kMiB);
  sim.synchronize(0);
  CHECK(sim.pool_usage(pool).reserved_bytes == 0);          // threshold 0
  CHECK(sim.pool_usage(other).reserved_bytes == 8 * kMiB);  // another device's pool waits
  PoolSettings keep;
  keep.release_threshold = ReleaseThreshold(2 * kMiB);
  sim.set_pool_settings(other, keep);
  sim.synchronize(1);
  CHECK(sim.pool_usage(other).reserved_bytes == 2 * kMiB);
  CHECK(sim.pool_usage(other).reserved_peak_bytes == 8 * kMiB);
  expect_error([&] { sim.free_shared(pool, a.address); }, "cuMemFreeAsync", "CUDA_ERROR_INVALID_VALUE");
}

TEST_CASE("export data and events are checked by the importer") {
  SimBackend holder(test::two_gpu_node());
  const PoolHandle pool = holder.create_pool(0, ipc_pool(16 * kMiB));
  const SharedAllocation shared = holder.allocate_shared(pool, 2 * kMiB, Backend::Readiness::event);
  const int fd = holder.export_pool_fd(pool);
  SimBackend client{NodeReport{}};
  const PoolHandle imported = client.import_pool_fd(0, fd);
  ::close(fd);  // the import keeps its own mapping

  Blob64 bad = shared.export_data;
  bad[0] = 'X';
  expect_error([&] { client.import_pointer(imported, bad); }, "cuMemPoolImportPointer", "CUDA_ERROR_INVALID_VALUE");
  bad = shared.export_data;
  bad[24 + 3] = 0x01;  // offset + 16 MiB: outside the 16 MiB arena
  expect_error([&] { client.import_pointer(imported, bad); }, "cuMemPoolImportPointer", "CUDA_ERROR_INVALID_VALUE");
  bad = shared.export_data;
  bad[32 + 3] = 0x01;  // size 16 MiB + 2 MiB: runs past the end
  expect_error([&] { client.import_pointer(imported, bad); }, "cuMemPoolImportPointer", "CUDA_ERROR_INVALID_VALUE");
  bad = shared.export_data;
  bad[16 + 4] = 0x01;  // another arena size: another pool
  expect_error([&] { client.import_pointer(imported, bad); }, "cuMemPoolImportPointer", "CUDA_ERROR_INVALID_VALUE");
  expect_error([&] { client.import_pointer(imported, Blob64{}); }, "cuMemPoolImportPointer",
               "CUDA_ERROR_INVALID_VALUE");
  expect_error([&] { client.wait_ready(0, Blob64{}); }, "cuIpcOpenEventHandle", "CUDA_ERROR_INVALID_VALUE");
  expect_error([&] { client.wait_ready(0, shared.export_data); }, "cuIpcOpenEventHandle", "CUDA_ERROR_INVALID_VALUE");

  // Only imported pools import pointers; imported pools don't allocate or export.
  expect_error([&] { holder.import_pointer(pool, shared.export_data); }, "cuMemPoolImportPointer",
               "CUDA_ERROR_INVALID_VALUE");
  expect_error([&] { client.allocate(imported, kMiB); }, "cuMemAllocFromPoolAsync", "CUDA_ERROR_INVALID_VALUE");
  expect_error([&] { client.export_pool_fd(imported); }, "cuMemPoolExportToShareableHandle",
               "CUDA_ERROR_INVALID_VALUE");
  // An fd that is no pool's.
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  expect_error([&] { client.import_pool_fd(0, pipe_fds[0]); }, "cuMemPoolImportFromShareableHandle",
               "CUDA_ERROR_INVALID_VALUE");
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  expect_error([&] { client.import_pool_fd(0, -1); }, "cuMemPoolImportFromShareableHandle", "CUDA_ERROR_INVALID_VALUE");

  const std::uint64_t address = client.import_pointer(imported, shared.export_data);
  client.wait_ready(0, holder.ready_event(0));
  std::uint8_t byte = 0xab;
  client.write(0, address + 2 * kMiB - 1, &byte, 1);  // the last byte
  expect_error([&] { client.write(0, address + 2 * kMiB - 1, &byte, 2); }, "cuMemcpyHtoD", "CUDA_ERROR_INVALID_VALUE");
  client.destroy_pool(imported);
  expect_error([&] { client.read(0, address, &byte, 1); }, "cuMemcpyDtoH", "CUDA_ERROR_INVALID_VALUE");
}

TEST_CASE("graph memory is zero on a simulated node; the sharing calls are logged and fail on request") {
  SimBackend sim(test::two_gpu_node());
  const GraphMemUsage g = sim.graph_mem_usage(1);
  CHECK(g.reserved_bytes == 0);
  CHECK(g.reserved_peak_bytes == 0);
  CHECK(g.used_bytes == 0);
  CHECK(g.used_peak_bytes == 0);
  sim.trim_graph_mem(1);
  sim.reset_graph_mem_peaks(1);
  CHECK_THROWS_AS(sim.graph_mem_usage(7), CudaError);
  const Blob64 event = sim.ready_event(0);
  CHECK(event == sim.ready_event(0));
  CHECK(event != sim.ready_event(1));
  const std::vector<std::string> expected{"graph_mem_usage(1)", "trim_graph_mem(1)", "reset_graph_mem_peaks(1)",
                                          "graph_mem_usage(7)", "ready_event(0)",    "ready_event(0)",
                                          "ready_event(1)"};
  CHECK(sim.calls() == expected);

  const PoolHandle pool = sim.create_pool(0, ipc_pool(64 * kMiB));
  sim.fail("export_pool_fd", "CUDA_ERROR_NOT_PERMITTED");
  expect_error([&] { sim.export_pool_fd(pool); }, "simulated export_pool_fd", "CUDA_ERROR_NOT_PERMITTED");
  sim.fail("allocate_shared", "CUDA_ERROR_OUT_OF_MEMORY");
  expect_error([&] { sim.allocate_shared(pool, kMiB, Backend::Readiness::event); }, "simulated allocate_shared",
               "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(sim.pool_usage(pool).used_bytes == 0);
  SimBackend client{NodeReport{}};
  client.fail("wait_ready", "CUDA_ERROR_UNKNOWN");
  expect_error([&] { client.wait_ready(0, event); }, "simulated wait_ready", "CUDA_ERROR_UNKNOWN");
  CHECK(client.calls().back() == "wait_ready(0)");
}

TEST_CASE("a simulated node says where its answers come from, and the report carries it") {
  NodeReport node = test::two_gpu_node();
  node.source.profile_path = "configs/profiles/h200x2.yaml";
  node.source.recorded = "2026-11-20T10:00:00Z";
  SimBackend sim(node);
  CHECK(sim.source().simulated);
  CHECK(sim.source().description == "simulated node (configs/profiles/h200x2.yaml)");
  CHECK(sim.source().recorded == "2026-11-20T10:00:00Z");
  const NodeReport report = build_report(sim);
  CHECK(report.source.simulated);
  CHECK(report.source.profile_path == "configs/profiles/h200x2.yaml");
  CHECK(report.source.description == sim.describe());
}

TEST_CASE("a failed probe is explained where the report is made") {
  NodeReport node = test::two_gpu_node();
  node.devices[1].info.pool_handle_types = 0;  // no posix_fd on device 1
  SimBackend sim(node);
  QueryOptions deep;
  deep.deep = true;
  const NodeReport report = build_report(sim, deep);
  const ExportProbe* posix = nullptr;
  for (const auto& p : report.devices[1].probes)
    if (p.handle_type == HandleType::posix_fd) posix = &p;
  REQUIRE(posix);
  CHECK_FALSE(posix->ok);
  CHECK(posix->error == "CUDA_ERROR_NOT_SUPPORTED");
  CHECK(posix->reason == "the driver does not support posix_fd handles for memory pools on this device");
  ExportProbe fabric{HandleType::fabric, false, "CUDA_ERROR_NOT_PERMITTED", "cuMemPoolExportToShareableHandle", "", ""};
  CHECK(explain_probe(fabric).rfind("no IMEX channel is reachable: ", 0) == 0);
  ExportProbe other{HandleType::posix_fd,      false, "CUDA_ERROR_LAUNCH_FAILED",
                    "cuMemAllocFromPoolAsync", "",    "unspecified launch failure"};
  CHECK(explain_probe(other) == "unspecified launch failure");
}

TEST_CASE("pool settings: one equality, one diff in the config's words") {
  PoolSettings a;
  PoolSettings b = a;
  CHECK(a == b);
  b.release_threshold = ReleaseThreshold::max();
  b.allow_internal_dependencies = false;
  CHECK(a != b);
  const auto diff = diff_settings(a, b);
  REQUIRE(diff.size() == 2);
  CHECK(diff[0].field == "release_threshold");
  CHECK(diff[0].from == "0B");
  CHECK(diff[0].to == "max");
  CHECK(diff[1].field == "reuse.allow_internal_dependencies");
  CHECK(diff[1].from == "true");
  CHECK(diff[1].to == "false");
  CHECK(diff_settings(b, b).empty());
}

TEST_CASE("simulated load_file stages on huge pages, and in pinned memory where registration is refused") {
  const std::string path = test::temp_path("staging.bin");
  std::vector<unsigned char> bytes(3ULL << 20);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i % 241);
  {
    Fd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    REQUIRE(::write(out.get(), bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  }
  Fd in(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(in);
  for (const bool refused : {false, true}) {
    CAPTURE(refused);
    SimBackend sim(test::two_gpu_node());
    if (refused) sim.fail("host_register", "CUDA_ERROR_NOT_SUPPORTED");
    PoolProps props;
    props.handle_types = 0x1;
    props.max_size = 64ULL << 20;
    const PoolHandle pool = sim.create_pool(0, props);
    const std::uint64_t p = sim.allocate(pool, bytes.size());
    LoadOptions o;
    o.direct = DirectIo::never;
    o.gds = Gds::never;
    const LoadReport r = sim.load_file(0, in.get(), {{0, p, bytes.size()}}, o, {});
    CHECK(r.chunk_bytes == 2ULL << 20);
    if (r.staging_note.rfind("madvise", 0) == 0) {  // a kernel without transparent huge pages
      CHECK(r.staging == Staging::pinned);
    } else {
      CHECK(r.staging == (refused ? Staging::pinned : Staging::huge_pages));
      CHECK(r.staging_note == (refused ? "cuMemHostRegister failed: CUDA_ERROR_NOT_SUPPORTED" : ""));
    }
    std::vector<unsigned char> back(bytes.size());
    sim.read(0, p, back.data(), back.size());
    CHECK(back == bytes);
    sim.free(pool, p);
  }
}
