// Tensor sets: the header of a safetensors file (https://huggingface.co/docs/safetensors), read and
// checked, and the tensor index a held buffer keeps (names, dtypes, shapes, offsets).
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}),
// then the data; offsets count from the data's first byte. Both the file and an index a holder is
// sent are untrusted: every bound below is checked before anything is allocated for it.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/fd.h"
#include "base/limits.h"
#include "model/model.h"

namespace cupool::tensors {

using Json = nlohmann::ordered_json;

inline constexpr std::uint64_t kMaxHeader = 100'000'000;  // bytes of header JSON (as the reference reader)
inline constexpr std::size_t kMaxTensors = 100'000;
inline constexpr std::size_t kMaxName = 1024;              // bytes of a tensor's name
inline constexpr std::size_t kMaxRank = 16;                // dimensions of a shape
inline constexpr std::size_t kMaxMetadata = 65536;         // bytes of __metadata__ keys and values together
inline constexpr std::uint64_t kAlignment = 256;           // of each tensor in a buffer (what CUDA allocations give)
inline constexpr std::size_t kMaxParts = kMaxBufferParts;  // allocations of one buffer (base/limits.h)
// The largest part `cupool buffer load` makes by default: none, a set is one piece. A device
// pool's buffer is an exported allocation (cuMemCreate), which importers map at any size (16 GiB in
// one piece on an H200, driver 580). Parts remain for sets larger than one device's free memory
// and for host pools, whose allocations are imported from the pool: there an import of one over
// 5 GiB crashed the importing process inside libcuda on the H100 (tests/gpu/RESULTS.md, 2026-11-25).
inline constexpr std::uint64_t kDefaultPartSize = UINT64_MAX;

// A dtype of the safetensors format and its element size.
struct DType {
  const char* name;  // as in the file: "F16"
  unsigned bytes;
};

// The dtype named `name`, or nullptr when safetensors has none of that name or cupool can't place
// it (sub-byte types).
const DType* find_dtype(std::string_view name);
// "BOOL, U8, I8, ...": for error messages.
std::string dtype_names();

struct Tensor {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::uint32_t part = 0;    // in a buffer: the part (allocation) that holds it
  std::uint64_t offset = 0;  // bytes from the first byte of the data (a file's) or of its part
  std::uint64_t size = 0;    // bytes
};

struct Index {
  std::vector<Tensor> tensors;  // by part, then offset
  std::map<std::string, std::string> metadata;
  std::vector<std::uint64_t> parts;  // a buffer's: the size of each part (a file's index: empty)
};

// A file's header: its index (offsets into the file's data) and where the data is.
struct FileHeader {
  Index index;
  std::uint64_t data_start = 0;  // 8 + the header's length
  std::uint64_t data_size = 0;   // the file's size - data_start
};

// Opens the file at `path` once, for its header and its data alike (a second open by path could
// find another file there: issue 22), without blocking (a FIFO with no writer would wait forever),
// and refuses what is not a regular file. A link is followed where it is the caller's or root's
// (model caches, Hugging Face's among them, link each file to a blob), not another user's. Throws
// InputError naming the file.
Fd open_file(const std::string& path);
// Reads and checks the header of the safetensors file open at `fd` (`path` names it in messages).
// Throws InputError naming the file and what is wrong (unreadable, truncated, header too large,
// not JSON, a name twice, an unknown dtype, a shape that does not match its offsets, offsets past
// the end or overlapping) and what would be valid.
FileHeader read_header(int fd, const std::string& path);
// open_file, then read_header.
FileHeader read_header(const std::string& path);
// The same over the file's first bytes (at least the length and the header) and its size: for the
// fuzzer and tests. `what` names the file in messages.
FileHeader parse_file(std::string_view what, std::string_view bytes, std::uint64_t file_size);

// Where each tensor goes in a buffer: in file order, each at a multiple of kAlignment of its part;
// a part is closed when the next tensor would take it past `part_size` (a larger tensor gets a part
// of its own). Returns the buffer's index with `parts` filled (at least one part, each at least 1
// byte), its tensors by part, offset, size and name (the order from_json gives). Throws
// InputError when that needs more than kMaxParts parts.
Index layout(const Index& file, std::uint64_t part_size = kDefaultPartSize);
// The bytes of all parts.
std::uint64_t total_size(const Index& index);

// One tensor as cupool prints and sends it (model::TensorEntry).
model::TensorEntry view(const Tensor& t);
// The index's tensors as they travel in the protocol ([{name, dtype, shape, part, offset_bytes,
// size_bytes}]) and its metadata ({"key": "text"}): buffer_create's `tensors` and `metadata`.
Json tensors_json(const Index& index);
Json metadata_json(const Index& index);
// The index as custody's manifest keeps it: {"tensors": [...], "metadata": {}, "parts": [bytes, ...]}.
Json to_json(const Index& index);
// An index a peer sent, checked against a buffer of parts of `parts` bytes (the same rules as a
// file, within each part); throws Error(bad_request) saying what is wrong.
Index from_json(const Json& tensors, const Json& metadata, const std::vector<std::uint64_t>& parts);

}  // namespace cupool::tensors
