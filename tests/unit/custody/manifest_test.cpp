#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "base/error.h"
#include "custody/custody.h"
#include "tests/unit/fixtures.h"

using namespace cupool;
using namespace cupool::custody;
using Json = nlohmann::ordered_json;

namespace {

Manifest sample() {
  Manifest m;
  m.sequence = 7;
  m.holder_uid = 0;
  m.holder_pid = 123;
  m.written = "2025-01-31T12:00:00Z";
  m.backend = "simulated";
  ManifestBuffer a;
  a.name = "weights.v1";
  a.pool = "default";
  a.device = 1;
  a.uuid = "GPU-00000000-0000-4000-8000-000000000001";
  a.size = 3 << 20;
  a.parts = {2 << 20, 1 << 20};
  a.mapped = {2 << 20, 2 << 20};
  a.owner = 1000;
  a.origin = "client";
  a.index = {{"tensors", Json::array({{{"name", "w"}, {"dtype", "F16"}, {"shape", {2, 3}}}})}, {"metadata", Json()}};
  ManifestBuffer b;
  b.name = "scratch";
  b.pool = "kv-cache";
  b.uuid = "GPU-00000000-0000-4000-8000-000000000000";
  b.size = 4096;
  b.parts = {4096};
  b.mapped = {2 << 20};
  b.origin = "config";
  b.index = nullptr;
  m.buffers = {a, b};
  return m;
}

// A memfd holding `text`, with `seals` added.
Fd memfd_with(const std::string& text, unsigned seals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) {
  Fd fd(::memfd_create("test-manifest", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd);
  REQUIRE(::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  if (seals) REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, seals) == 0);
  return fd;
}

// `j` with its right digest, sealed.
Fd sealed_json(Json j) {
  j.erase("digest");
  j["digest"] = manifest_digest(j);
  return memfd_with(j.dump());
}

std::string refused_because(int fd, const std::string& name = "cupool-manifest.7") {
  try {
    (void)open_manifest(fd, name);
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_input);
    return e.what();
  }
  return "(accepted)";
}

std::string field_refused_because(const std::function<void(Json&)>& change) {
  Json j = to_json(sample());
  change(j);
  const Fd fd = sealed_json(j);
  return refused_because(fd.get());
}

}  // namespace

TEST_SUITE("custody") {
  TEST_CASE("custody: names of descriptors and their parsing") {
    CHECK(part_fd_name("weights.v1", 3) == "cupool-buffer.weights.v1.3");
    CHECK(manifest_fd_name(42) == "cupool-manifest.42");
    const auto part = parse_part_fd_name("cupool-buffer.weights.v1.3");
    REQUIRE(part);
    CHECK(part->first == "weights.v1");
    CHECK(part->second == 3);
    CHECK(parse_part_fd_name(part_fd_name("a", 1023)));
    CHECK_FALSE(parse_part_fd_name("cupool-buffer.a.1024"));  // past kMaxParts
    CHECK_FALSE(parse_part_fd_name("cupool-buffer.a.01"));
    CHECK_FALSE(parse_part_fd_name("cupool-buffer.a."));
    CHECK_FALSE(parse_part_fd_name("cupool-buffer.3"));
    CHECK_FALSE(parse_part_fd_name("cupool-buffer.Big.0"));  // not a buffer name
    CHECK_FALSE(parse_part_fd_name("cupool-manifest.3"));
    CHECK_FALSE(parse_part_fd_name(std::string("cupool-buffer.a\0b.0", 19)));  // found by the fuzzer
    CHECK(parse_manifest_fd_name("cupool-manifest.18446744073709551615") == UINT64_MAX);
    CHECK_FALSE(parse_manifest_fd_name("cupool-manifest.18446744073709551616"));
    CHECK_FALSE(parse_manifest_fd_name("cupool-manifest.07"));
    CHECK_FALSE(parse_manifest_fd_name("cupool-manifest."));
    CHECK_FALSE(parse_manifest_fd_name("cupool-buffer.a.0"));
    CHECK(valid_fd_name("cupool-buffer.a.0"));
    CHECK(valid_fd_name(std::string(200, 'A')));
    CHECK_FALSE(valid_fd_name(std::string(201, 'A')));
    CHECK_FALSE(valid_fd_name(""));
    CHECK_FALSE(valid_fd_name("a:b"));
    CHECK_FALSE(valid_fd_name("a b"));
  }

  TEST_CASE("custody: a manifest reads back as it was sealed") {
    const Manifest m = sample();
    const Fd fd = seal_manifest(m);
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    CHECK((seals & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
          (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
    const Manifest back = open_manifest(fd.get(), manifest_fd_name(7));
    CHECK(to_json(back) == to_json(m));
    CHECK(back.buffers[0].index == m.buffers[0].index);
    CHECK(back.buffers[1].index.is_null());
    // The digest is over the rest, in the canonical text.
    char text[8192] = {};
    const ssize_t n = ::pread(fd.get(), text, sizeof text, 0);
    REQUIRE(n > 0);
    const Json j = Json::parse(std::string(text, static_cast<std::size_t>(n)));
    CHECK(j["digest"] == manifest_digest(to_json(m)));
    CHECK(j["digest"].get<std::string>().size() == 7 + 64);
    // An empty "written" is now.
    Manifest unwritten = m;
    unwritten.written.clear();
    const Fd now = seal_manifest(unwritten);
    CHECK(open_manifest(now.get(), "cupool-manifest.7").written.size() == 20);
    // Nothing but a sequence and a backend.
    Manifest empty;
    empty.sequence = 1;
    empty.holder_pid = 1;
    empty.backend = "cuda";
    const Fd none = seal_manifest(empty);
    CHECK(open_manifest(none.get(), "custody-test").buffers.empty());
  }

  TEST_CASE("custody: a manifest of version 2 (the names of the rules) reads as the same manifest") {
    const Manifest m = sample();
    const Json v2 = manifest_version2(m);
    CHECK(v2["manifest"] == 2);
    const Json& b = v2["buffers"][0];
    for (const char* name : {"size_bytes", "part_sizes_bytes", "mapped_sizes_bytes", "owner_uid", "tensor_index"})
      CHECK_MESSAGE(b.contains(name), name);
    for (const char* name : {"size", "parts", "mapped", "owner", "index"}) CHECK_MESSAGE(!b.contains(name), name);
    const Fd fd = sealed_json(v2);
    const Manifest back = open_manifest(fd.get(), manifest_fd_name(7));
    CHECK(to_json(back) == to_json(m));
    // What a holder writes is still version 1 (a holder rolled back to 0.1.0 reads it).
    const Fd written = seal_manifest(m);
    char text[8192] = {};
    REQUIRE(::pread(written.get(), text, sizeof text, 0) > 0);
    CHECK(Json::parse(text)["manifest"] == 1);
  }

  TEST_CASE("custody: a manifest whose contents changed is refused, naming who wrote it") {
    Json j = to_json(sample());
    j["digest"] = manifest_digest(j);
    j["sequence"] = 8;  // changed after the digest
    const Fd fd = memfd_with(j.dump());
    CHECK(refused_because(fd.get(), "cupool-manifest.8") ==
          "manifest cupool-manifest.8: the digest does not match its contents (written by pid 123 at "
          "2025-01-31T12:00:00Z)");
    Json bad_digest = to_json(sample());
    bad_digest["digest"] = "sha256:0000";
    const Fd fd2 = memfd_with(bad_digest.dump());
    CHECK(refused_because(fd2.get()).find("the digest does not match") != std::string::npos);
    const Fd fd3 = memfd_with(to_json(sample()).dump());
    CHECK(refused_because(fd3.get()) == "manifest cupool-manifest.7: has no digest (\"digest\": \"sha256:...\")");
  }

  TEST_CASE("custody: a manifest that is not a sealed memfd is refused") {
    Json j = to_json(sample());
    j["digest"] = manifest_digest(j);
    const Fd unsealed = memfd_with(j.dump(), 0);
    CHECK(refused_because(unsealed.get()).find("is not sealed against writing") != std::string::npos);
    const Fd half = memfd_with(j.dump(), F_SEAL_WRITE);
    CHECK(refused_because(half.get()).find("is not sealed against writing") != std::string::npos);

    const std::string path = test::temp_path("manifest.json");
    Fd file(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    REQUIRE(file);
    const std::string text = j.dump();
    REQUIRE(::write(file.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    CHECK(refused_because(file.get()).find("is not a memfd") != std::string::npos);
    ::unlink(path.c_str());

    int pipe_fds[2];
    REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
    const Fd r(pipe_fds[0]), w(pipe_fds[1]);
    CHECK(refused_because(r.get()) ==
          "manifest cupool-manifest.7: is not a memfd (a sealed memfd is expected; this is not a file)");
    CHECK(refused_because(-1).find("can't be read") != std::string::npos);
  }

  TEST_CASE("custody: an oversized, empty or unparsable manifest is refused") {
    Fd big(::memfd_create("test-manifest", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(::ftruncate(big.get(), (64 << 20) + 1) == 0);  // sparse: costs no memory
    REQUIRE(::fcntl(big.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    CHECK(refused_because(big.get()) ==
          "manifest cupool-manifest.7: is 67108865 bytes, more than the 64 MiB a manifest may be");
    const Fd empty = memfd_with("");
    CHECK(refused_because(empty.get()) == "manifest cupool-manifest.7: is empty");
    const Fd text = memfd_with("{\"manifest\": 1,");
    CHECK(refused_because(text.get()).rfind("manifest cupool-manifest.7: is not JSON: it is not valid JSON", 0) == 0);
    const Fd array = memfd_with("[1]");
    CHECK(refused_because(array.get()) == "manifest cupool-manifest.7: is not a JSON object");
    const Fd binary = memfd_with(std::string("{\"a\":\"\xff\"}"));
    CHECK(refused_because(binary.get()) == "manifest cupool-manifest.7: is not JSON (it is not valid UTF-8)");
  }

  TEST_CASE("custody: each field of a manifest is checked, and the message says which") {
    const std::string m = "manifest cupool-manifest.7: ";
    CHECK(field_refused_because([](Json&) {}) == "(accepted)");
    CHECK(field_refused_because([](Json& j) { j["manifest"] = 3; }) ==
          m + "manifest version 3 is not supported (this holder reads versions 1 and 2)");
    // Version 2 with version 1's names.
    CHECK(field_refused_because([](Json& j) { j["manifest"] = 2; }) ==
          m + "buffers[0]: \"size\" is version 1's name (version 2 says \"size_bytes\")");
    CHECK(field_refused_because([](Json& j) { j["sequence"] = 8; }) == m + "it says it is sequence 8, its name says 7");
    CHECK(field_refused_because([](Json& j) { j["sequence"] = 0; }) ==
          m + "sequence: 0 is outside 1..9007199254740992");
    CHECK(field_refused_because([](Json& j) { j.erase("backend"); }) == m + "backend: missing");
    CHECK(field_refused_because([](Json& j) { j["backend"] = "opencl"; }) ==
          m + "backend: \"opencl\" is not cuda or simulated");
    CHECK(field_refused_because([](Json& j) { j["extra"] = 1; }) == m + "unknown key \"extra\"");
    CHECK(field_refused_because([](Json& j) { j["holder"]["pid"] = 0; }) ==
          m + "holder.pid: 0 is outside 1..2147483647");
    CHECK(field_refused_because([](Json& j) { j["holder"]["gid"] = 0; }) == m + "holder: unknown key \"gid\"");
    CHECK(field_refused_because([](Json& j) { j["written"] = "yesterday"; }) ==
          m + "written: \"yesterday\" is not a UTC time in ISO 8601 (2025-01-31T12:00:00Z)");
    CHECK(field_refused_because([](Json& j) { j["written"] = "2025-13-01T00:00:00Z"; }).find("written:") !=
          std::string::npos);
    CHECK(field_refused_because([](Json& j) { j["written"] = "2025-01-31T12:00:00.123456Z"; }) == "(accepted)");
    CHECK(field_refused_because([](Json& j) { j["buffers"] = Json::object(); }) ==
          m + "buffers: must be an array of at most 8192 buffers");
    CHECK(field_refused_because([](Json& j) { j["buffers"][1]["name"] = "Bad Name"; }) ==
          m + "buffers[1].name: \"Bad Name\" is not a name ([a-z0-9][a-z0-9._-]*, at most 64 bytes)");
    CHECK(field_refused_because([](Json& j) { j["buffers"][1]["name"] = "weights.v1"; }) ==
          m + "buffers[1].name: the buffer weights.v1 is listed twice");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["size"] = 1; }) ==
          m + "buffers[0].parts: the parts add up to 3145728 bytes, not the size 1");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["mapped"][1] = 1; }) ==
          m + "buffers[0].mapped[1]: 1 bytes mapped for a part of 1048576");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["mapped"] = {2 << 20}; }) ==
          m + "buffers[0].mapped: 1 sizes for 2 parts");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["parts"] = Json::array(); }) ==
          m + "buffers[0].parts: must be an array of 1 to 1024 sizes");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["parts"][0] = -1; }) ==
          m + "buffers[0].parts[0]: must be a non-negative integer");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["parts"] = Json(std::vector<int>(1025, 1)); }) ==
          m + "buffers[0].parts: must be an array of 1 to 1024 sizes");
    CHECK(field_refused_because([](Json& j) {
            j["buffers"][0]["parts"] = {UINT64_MAX, 1};
          }) == m + "buffers[0].parts: the sizes add up to more than 2^64-1 bytes");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["uuid"] = "0000"; }) ==
          m + "buffers[0].uuid: \"0000\" is not a device's UUID (GPU-... or MIG-..., at most 96 characters)");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["device"] = 5000; }) ==
          m + "buffers[0].device: 5000 is outside 0..4096");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["owner"] = 1ULL << 32; }) ==
          m + "buffers[0].owner: 4294967296 is outside 0..4294967295");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["origin"] = "thin air"; }) ==
          m + "buffers[0].origin: \"thin air\" is not config or client");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["index"] = Json::array(); }) ==
          m + "buffers[0].index: must be an object (a tensor index) or null");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0].erase("index"); }) == m + "buffers[0].index: missing");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0]["colour"] = "red"; }) ==
          m + "buffers[0]: unknown key \"colour\"");
    CHECK(field_refused_because([](Json& j) { j["buffers"][0] = 3; }) == m + "buffers[0]: is not an object");
  }

  TEST_CASE("custody: a manifest the reader would refuse is not written") {
    Manifest m = sample();
    m.buffers[0].parts = {1};
    try {
      (void)seal_manifest(m);
      FAIL("sealed");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_input);
      CHECK(std::string(e.what()) ==
            "can't be written: manifest cupool-manifest.7: buffers[0].parts: the parts add up to 1 bytes, not the size "
            "3145728");
    }
    CHECK(iso_utc_now().size() == 20);
  }

  TEST_CASE("custody: the node report kept beside the manifest reads back, and nothing else is taken for it") {
    KeptNode node{"sha256:abc", Json{{"driver", {{"cuda_version", "13.0"}}}, {"devices", Json::array()}}, ""};
    const Fd fd = seal_node(node);
    const KeptNode back = open_node(fd.get());
    CHECK(back.fingerprint == "sha256:abc");
    CHECK(back.report == node.report);
    CHECK(back.written.size() == 20);
    auto refused = [](const Json& j) {
      const Fd f = memfd_with(j.dump());
      try {
        open_node(f.get());
      } catch (const Error& e) {
        CHECK(e.code() == Errc::invalid_input);
        return std::string(e.what());
      }
      return std::string("accepted");
    };
    Json good = {{"node", 1}, {"fingerprint", "sha256:abc"}, {"written", "2026-11-29T10:00:00Z"}, {"report", {}}};
    good["report"] = Json::object();
    Json signed_good = good;
    signed_good["digest"] = manifest_digest(good);
    CHECK(refused(signed_good) == "accepted");
    Json changed = signed_good;
    changed["fingerprint"] = "sha256:abd";
    CHECK(refused(changed).find("the digest does not match") != std::string::npos);
    Json extra = good;
    extra["more"] = 1;
    extra["digest"] = manifest_digest(extra);
    CHECK(refused(extra).find("fields other than") != std::string::npos);
    Json version = good;
    version["node"] = 2;
    version["digest"] = manifest_digest(version);
    CHECK(refused(version).find("is not version 1") != std::string::npos);
    Json no_report = good;
    no_report.erase("report");
    no_report["digest"] = manifest_digest(no_report);
    CHECK(refused(no_report).find("has no \"report\"") != std::string::npos);
    const Fd unsealed = memfd_with(signed_good.dump(), 0);
    CHECK_THROWS_AS(open_node(unsealed.get()), Error);
    CHECK_THROWS_AS(seal_node(KeptNode{"", Json::object(), ""}), Error);
  }
}
