// What every backend shares (core/device/backend.cpp): handle type names, the error of a failed
// driver call, and exact reads of a file's range.
#include "device/backend.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "tests/unit/fixtures.h"

namespace cupool::backend_test {

TEST_CASE("handle_type_name: the config's words for each handle type") {
  CHECK(std::string(handle_type_name(HandleType::none)) == "none");
  CHECK(std::string(handle_type_name(HandleType::posix_fd)) == "posix_fd");
  CHECK(std::string(handle_type_name(HandleType::fabric)) == "fabric");
  CHECK(std::string(handle_type_name(static_cast<HandleType>(0x4))) == "unknown");
}

TEST_CASE("handle_type_names: every bit of the driver's mask, Windows' included, in bit order") {
  CHECK(handle_type_names(0).empty());
  CHECK(handle_type_names(0x1) == std::vector<std::string>{"posix_fd"});
  CHECK(handle_type_names(0x8) == std::vector<std::string>{"fabric"});
  CHECK(handle_type_names(0x9) == std::vector<std::string>{"posix_fd", "fabric"});
  CHECK(handle_type_names(0xf) == std::vector<std::string>{"posix_fd", "win32", "win32_kmt", "fabric"});
  CHECK(handle_type_names(0x10).empty());  // a bit the driver has not defined
}

TEST_CASE("CudaError: names the call and the error, with the driver's words when it has them") {
  const CudaError e("cuMemPoolCreate", 801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported");
  CHECK(std::string(e.what()) == "cuMemPoolCreate failed: CUDA_ERROR_NOT_SUPPORTED (operation not supported)");
  CHECK(e.api() == "cuMemPoolCreate");
  CHECK(e.result() == 801);
  CHECK(e.name() == "CUDA_ERROR_NOT_SUPPORTED");
  CHECK(e.description() == "operation not supported");
  CHECK(e.code() == Errc::cuda);
  const CudaError bare("cuInit", 999, "CUDA_ERROR_UNKNOWN", "");
  CHECK(std::string(bare.what()) == "cuInit failed: CUDA_ERROR_UNKNOWN");
  CHECK(bare.description().empty());
  // Caught as the project's Error, as main catches it.
  try {
    throw CudaError("cuMemAllocFromPoolAsync", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory");
  } catch (const Error& caught) {
    CHECK(caught.code() == Errc::cuda);
    CHECK(std::string(caught.what()).find("cuMemAllocFromPoolAsync") == 0);
  }
}

// A file of `size` bytes, byte i = i % 251, in the test's scratch directory; open for reading.
class Numbered {
 public:
  explicit Numbered(std::size_t size) : path_(test::temp_path("numbered.bin")) {
    std::vector<char> bytes(size);
    for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i % 251);
    std::ofstream(path_, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(size));
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd_ >= 0);
  }
  Numbered(const Numbered&) = delete;
  Numbered& operator=(const Numbered&) = delete;
  ~Numbered() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST_CASE("read_file_range: reads exactly the range asked for") {
  const Numbered file(100000);
  std::vector<char> into(70000, '\x7f');
  read_file_range(file.fd(), into.data(), 70000, 12345);
  bool same = true;
  for (std::size_t i = 0; i < into.size(); ++i) same = same && into[i] == static_cast<char>((12345 + i) % 251);
  CHECK(same);
  // Up to the last byte, and nothing at all.
  std::array<char, 4> tail{};
  read_file_range(file.fd(), tail.data(), 4, 99996);
  CHECK(tail == std::array<char, 4>{static_cast<char>(99996 % 251), static_cast<char>(99997 % 251),
                                    static_cast<char>(99998 % 251), static_cast<char>(99999 % 251)});
  char untouched = 'u';
  read_file_range(file.fd(), &untouched, 0, 500000);
  CHECK(untouched == 'u');
}

TEST_CASE("read_file_range: a file that ends early is an input error naming where it ended and what was wanted") {
  const Numbered file(1000);
  std::vector<char> into(200);
  try {
    read_file_range(file.fd(), into.data(), 200, 900);
    FAIL("expected InputError");
  } catch (const InputError& e) {
    CHECK(e.code() == Errc::invalid_input);
    CHECK(std::string(e.what()) ==
          "the file ended at byte 1000, before byte 1100 (was it truncated while being read?)");
  }
  // What could be read was read.
  CHECK(into[0] == static_cast<char>(900 % 251));
  CHECK(into[99] == static_cast<char>(999 % 251));
  // Starting past the end.
  CHECK_THROWS_WITH_AS(read_file_range(file.fd(), into.data(), 1, 5000),
                       "the file ended at byte 5000, before byte 5001 (was it truncated while being read?)",
                       InputError);
}

TEST_CASE("read_file_range: a descriptor that can't be read is an input error saying why") {
  std::array<char, 8> into{};
  CHECK_THROWS_WITH_AS(read_file_range(-1, into.data(), into.size(), 0), "reading the file failed: Bad file descriptor",
                       InputError);
}

}  // namespace cupool::backend_test
