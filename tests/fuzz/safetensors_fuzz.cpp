// Fuzz target: a safetensors file's first bytes -> the header reader (tensors/safetensors.h) ->
// the buffer layout in parts -> the index as the protocol carries it -> the holder's check of it.
// Each input is read twice: as the file it is (its 8-byte length as written), and with the length
// made to fit the JSON that follows and the data as long as the first 5 bytes say (up to 1 TiB:
// parse_file sees only the header, so big files cost nothing), so mutations of the JSON reach the
// checks behind the length. A refusal must be an InputError naming the file (never another
// exception); what is accepted must keep the invariants: tensors sorted, within the data and not
// overlapping; each part at most the part size unless one tensor alone is larger; every tensor
// 256-byte aligned within its part; and the index the holder is sent reads back as the same index.
// Built two ways (tests/fuzz/CMakeLists.txt): with libFuzzer when CUPOOL_FUZZ=ON (clang), and
// always as a deterministic driver (mutate_main.cpp) that CTest runs under the sanitizers.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "base/error.h"
#include "tensors/safetensors.h"

namespace {

using cupool::tensors::Index;
using cupool::tensors::Tensor;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

void check_file_index(const cupool::tensors::FileHeader& h) {
  const Tensor* previous = nullptr;
  for (const Tensor& t : h.index.tensors) {
    require(t.offset <= h.data_size && t.size <= h.data_size - t.offset);
    require(cupool::tensors::find_dtype(t.dtype) != nullptr);
    if (previous) require(previous->offset <= t.offset);
    if (previous && t.size) require(previous->offset + previous->size <= t.offset);
    if (t.size) previous = &t;
  }
}

bool same(const Index& a, const Index& b) {
  if (a.tensors.size() != b.tensors.size() || a.metadata != b.metadata || a.parts != b.parts) return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.part != y.part || x.offset != y.offset ||
        x.size != y.size)
      return false;
  }
  return true;
}

void check_layout(const Index& file, std::uint64_t part_size) {
  Index placed;
  try {
    placed = cupool::tensors::layout(file, part_size);
  } catch (const cupool::InputError&) {
    return;  // more than kMaxParts parts at this part size: refused, said so
  }
  require(placed.tensors.size() == file.tensors.size());
  require(!placed.parts.empty() && placed.parts.size() <= cupool::tensors::kMaxParts);
  for (std::uint64_t p : placed.parts) require(p >= 1);
  // Every tensor of the file, placed; those with bytes in file order (the zero-size ones may share
  // an offset, and are then ordered by name, as the holder reads them back).
  std::map<std::string, std::size_t> in_file;
  for (std::size_t i = 0; i < file.tensors.size(); ++i) in_file[file.tensors[i].name] = i;
  std::size_t last_with_bytes = 0;
  bool any_with_bytes = false;
  for (std::size_t i = 0; i < placed.tensors.size(); ++i) {
    const Tensor& t = placed.tensors[i];
    const auto from = in_file.find(t.name);
    require(from != in_file.end() && t.size == file.tensors[from->second].size &&
            t.dtype == file.tensors[from->second].dtype);
    if (t.size > 0) {
      require(!any_with_bytes || from->second > last_with_bytes);
      last_with_bytes = from->second;
      any_with_bytes = true;
    }
    require(t.offset % cupool::tensors::kAlignment == 0);
    require(t.part < placed.parts.size());
    require(t.offset <= placed.parts[t.part] && t.size <= placed.parts[t.part] - t.offset);
    if (i > 0) require(placed.tensors[i - 1].part <= t.part);
  }
  // A part is larger than the part size only when it holds one tensor that is.
  for (std::size_t p = 0; p < placed.parts.size(); ++p)
    if (placed.parts[p] > std::max(part_size, cupool::tensors::kAlignment)) {
      std::size_t in = 0;
      for (const Tensor& t : placed.tensors) in += t.part == p && t.size > 0;
      require(in == 1);
    }
  // What `cupool buffer load` sends, the holder reads back the same (sorted by part and offset,
  // which file order already is).
  try {
    const Index back = cupool::tensors::from_json(cupool::tensors::tensors_json(placed),
                                                  cupool::tensors::metadata_json(placed), placed.parts);
    require(same(back, placed));
  } catch (const cupool::Error&) {
    require(false);
  }
}

void read(std::string_view what, std::string_view bytes, std::uint64_t file_size) {
  cupool::tensors::FileHeader h;
  try {
    h = cupool::tensors::parse_file(what, bytes, file_size);
  } catch (const cupool::InputError& e) {
    require(std::string_view(e.what()).substr(0, what.size()) == what);  // names the file
    return;
  }
  check_file_index(h);
  check_layout(h.index, cupool::tensors::kDefaultPartSize);
  check_layout(h.index, 1 << 20);
  check_layout(h.index, 1);  // every tensor a part of its own (or refused past kMaxParts)
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  read("fuzz.safetensors", input, size);
  if (size < 8) return 0;
  // The same JSON behind a length that fits it, the data as long as bytes 0-4 say.
  std::uint64_t data_size = 0;
  for (int i = 4; i >= 0; --i)
    data_size = (data_size << 8) | static_cast<unsigned char>(input[static_cast<std::size_t>(i)]);
  const std::string_view json = input.substr(8);
  std::string fixed(8, '\0');
  for (int i = 0; i < 8; ++i) fixed[static_cast<std::size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  fixed += json;
  read("fixed.safetensors", fixed, fixed.size() + data_size);
  return 0;
}
