#include "tensors/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <functional>

#include "base/error.h"
#include "base/fd.h"
#include "base/json_reader.h"
#include "base/text.h"
#include "base/units.h"

namespace cupool::tensors {

namespace {

// What safetensors defines and a byte-addressed buffer can hold (F4/F6 pack several per byte).
constexpr std::array<DType, 15> kDTypes = {{
    {"BOOL", 1},
    {"U8", 1},
    {"I8", 1},
    {"F8_E5M2", 1},
    {"F8_E4M3", 1},
    {"I16", 2},
    {"U16", 2},
    {"F16", 2},
    {"BF16", 2},
    {"I32", 4},
    {"U32", 4},
    {"F32", 4},
    {"F64", 8},
    {"I64", 8},
    {"U64", 8},
}};

constexpr int kMaxDepth = 8;  // a header is {name: {shape: [..]}}: anything deeper is not one

using Fail = std::function<void(const std::string&)>;  // throws

// A byte count or a size: an integer of 0 or more (JSON built in C++ may hold it signed).
bool is_count(const Json& j) { return j.is_number_unsigned() || (j.is_number_integer() && j.get<std::int64_t>() >= 0); }

// Checks one tensor's fields and fills `t` from them. `where` names it in messages.
Tensor read_entry(const std::string& name, const Json& entry, const char* offsets_key, const Fail& fail) {
  const std::string where = "tensor \"" + valid_utf8(name) + "\"";
  if (name.empty()) fail("a tensor has an empty name");
  if (name.size() > kMaxName)
    fail(valid_utf8(where.substr(0, 80)) + "...: a name is at most " + std::to_string(kMaxName) + " bytes");
  // Names reach `buffer ls`, JSON indexes and Python: printable text only (docs/protocol.md).
  if (!displays_as_is(name))
    fail("tensor \"" + valid_utf8(safe_for_display(name).substr(0, 80)) +
         "\": a name is printable UTF-8 text (no control characters: C0, DEL, C1; no bidirectional formatting "
         "characters such as U+202E)");
  if (!entry.is_object()) fail(where + ": expected an object with dtype, shape and " + offsets_key);
  Tensor t;
  t.name = name;
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) fail(where + ": needs \"dtype\", a string");
  t.dtype = dtype->get<std::string>();
  const DType* info = find_dtype(t.dtype);
  if (!info) fail(where + ": unknown dtype \"" + valid_utf8(t.dtype) + "\" (valid: " + dtype_names() + ")");
  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) fail(where + ": needs \"shape\", an array of sizes");
  if (shape->size() > kMaxRank) fail(where + ": a shape has at most " + std::to_string(kMaxRank) + " dimensions");
  std::uint64_t elements = 1;
  bool overflow = false;
  for (const Json& d : *shape) {
    if (!is_count(d)) fail(where + ": a shape's sizes are integers of 0 or more");
    const std::uint64_t n = d.get<std::uint64_t>();
    t.shape.push_back(n);
    if (n != 0 && elements > UINT64_MAX / n)
      overflow = true;
    else
      elements *= n;
  }
  if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) elements = 0, overflow = false;
  if (overflow || elements > UINT64_MAX / info->bytes) fail(where + ": its shape holds more than 2^64 bytes");
  const std::uint64_t bytes = elements * info->bytes;
  if (std::string(offsets_key) == "data_offsets") {
    const auto offsets = entry.find("data_offsets");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 || !is_count((*offsets)[0]) ||
        !is_count((*offsets)[1]))
      fail(where + ": needs \"data_offsets\", [begin, end] in bytes from the start of the data");
    const std::uint64_t begin = (*offsets)[0].get<std::uint64_t>(), end = (*offsets)[1].get<std::uint64_t>();
    if (end < begin)
      fail(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] end before they begin");
    t.offset = begin;
    t.size = end - begin;
  } else {
    const auto offset = entry.find("offset_bytes"), size = entry.find("size_bytes");
    if (offset == entry.end() || !is_count(*offset) || size == entry.end() || !is_count(*size))
      fail(where + ": needs \"offset_bytes\" and \"size_bytes\", byte counts");
    t.offset = offset->get<std::uint64_t>();
    t.size = size->get<std::uint64_t>();
    if (const auto part = entry.find("part"); part != entry.end()) {
      if (!is_count(*part) || part->get<std::uint64_t>() >= kMaxParts)
        fail(where + ": \"part\" is the number of a part, 0 to " + std::to_string(kMaxParts - 1));
      t.part = static_cast<std::uint32_t>(part->get<std::uint64_t>());
    }
  }
  if (t.size != bytes)
    fail(where + ": " + t.dtype + " of shape " + Json(t.shape).dump() + " is " + std::to_string(bytes) +
         " bytes, but its offsets span " + std::to_string(t.size));
  return t;
}

// The one order of an index, whatever the input's: by part, offset, size, then name (zero-size
// tensors may share an offset with each other and with the tensor that follows them).
bool by_place(const Tensor& a, const Tensor& b) {
  if (a.part != b.part) return a.part < b.part;
  if (a.offset != b.offset) return a.offset < b.offset;
  return a.size != b.size ? a.size < b.size : a.name < b.name;
}

// Sorts by place and checks that every tensor lies within its part (`limits[part]` bytes; a
// file's data is one part) and none overlaps another.
void check_ranges(std::vector<Tensor>& tensors, const std::vector<std::uint64_t>& limits, const std::string& space,
                  const Fail& fail) {
  std::sort(tensors.begin(), tensors.end(), by_place);
  const Tensor* previous = nullptr;
  for (const Tensor& t : tensors) {
    if (t.part >= limits.size())
      fail("tensor \"" + valid_utf8(t.name) + "\" is in part " + std::to_string(t.part) + ", but the " + space +
           " has " + std::to_string(limits.size()) + (limits.size() == 1 ? " part" : " parts"));
    const std::uint64_t limit = limits[t.part];
    const std::string in = limits.size() > 1 ? " of part " + std::to_string(t.part) : "";
    if (t.offset > limit || t.size > limit - t.offset)
      fail("tensor \"" + valid_utf8(t.name) + "\" spans bytes " + std::to_string(t.offset) + " to " +
           std::to_string(t.offset + t.size) + in + ", past the end of the " + space + " (" + std::to_string(limit) +
           " bytes)");
    if (t.size == 0) continue;
    if (previous && previous->part == t.part && t.offset < previous->offset + previous->size)
      fail("tensors \"" + valid_utf8(previous->name) + "\" and \"" + valid_utf8(t.name) + "\" overlap (bytes " +
           std::to_string(t.offset) + " to " + std::to_string(previous->offset + previous->size) + in + " of the " +
           space + ")");
    previous = &t;
  }
}

// A metadata value: lines of text (tab and newline allowed), otherwise what displays as itself.
bool text_value(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    std::uint32_t cp = 0;
    const std::size_t len = decode_utf8(s, i, &cp);
    if (!len || (cp != '\t' && cp != '\n' && !display_safe(cp))) return false;
    i += len;
  }
  return true;
}

std::map<std::string, std::string> read_metadata(const Json& m, const Fail& fail) {
  std::map<std::string, std::string> out;
  if (m.is_null()) return out;
  if (!m.is_object()) fail("__metadata__ must be an object of strings");
  std::size_t bytes = 0;
  for (const auto& [k, v] : m.items()) {
    if (!displays_as_is(k))
      fail("__metadata__ \"" + valid_utf8(safe_for_display(k).substr(0, 80)) +
           "\": a key is printable UTF-8 text (no control or bidirectional formatting characters)");
    if (!v.is_string()) fail("__metadata__ \"" + valid_utf8(k) + "\": values must be strings");
    if (!text_value(v.get_ref<const std::string&>()))
      fail("__metadata__ \"" + valid_utf8(k) +
           "\": a value is UTF-8 text; of the control and bidirectional formatting characters it may hold only tab "
           "and newline");
    bytes += k.size() + v.get_ref<const std::string&>().size();
    if (bytes > kMaxMetadata) fail("__metadata__ holds more than " + std::to_string(kMaxMetadata) + " bytes");
    out[k] = v.get<std::string>();
  }
  return out;
}

std::uint64_t read_le64(std::string_view bytes) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  return n;
}

FileHeader parse_header(std::string_view what, std::string_view json, std::uint64_t data_start,
                        std::uint64_t file_size) {
  const std::string file(what);
  const Fail fail = [&](const std::string& message) { throw InputError(file + ": " + message); };
  // Read in linear time, the tensor count bounded while reading (the entries and __metadata__),
  // a name twice refused (nlohmann's parser let the last one win).
  const std::string too_many = "the header has more than " + std::to_string(kMaxTensors) + " tensors";
  JsonLimits limits;
  limits.max_depth = kMaxDepth;
  limits.max_keys = kMaxTensors + 1;
  limits.too_many_keys = too_many.c_str();
  Json header;
  try {
    header = read_json(json, limits);
  } catch (const JsonReadError& e) {
    const std::string why = e.what();
    if (why.rfind("nests deeper", 0) == 0) fail("the header nests deeper than a safetensors header does");
    if (why.rfind("is not valid JSON", 0) == 0)
      fail("the header " + why + "; is this a safetensors file? it starts with an 8-byte length, then JSON");
    fail(why == too_many ? why : "the header " + why);
  }
  if (!header.is_object()) fail("the header is not a JSON object of tensors");
  FileHeader out;
  out.data_start = data_start;
  out.data_size = file_size - data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__")
      out.index.metadata = read_metadata(entry, fail);
    else
      out.index.tensors.push_back(read_entry(name, entry, "data_offsets", fail));
  }
  if (out.index.tensors.size() > kMaxTensors) fail(too_many);
  check_ranges(out.index.tensors, {out.data_size}, "data", fail);
  return out;
}

}  // namespace

const DType* find_dtype(std::string_view name) {
  for (const DType& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string dtype_names() {
  std::string out;
  for (const DType& d : kDTypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

FileHeader parse_file(std::string_view what, std::string_view bytes, std::uint64_t file_size) {
  const std::string file(what);
  if (file_size < 8 || bytes.size() < 8)
    throw InputError(file + ": truncated: a safetensors file starts with an 8-byte header length, and this one has " +
                     std::to_string(file_size) + " bytes");
  const std::uint64_t length = read_le64(bytes);
  if (length > kMaxHeader)
    throw InputError(file + ": the header is " + std::to_string(length) + " bytes; at most " +
                     std::to_string(kMaxHeader) + " are read (is this a safetensors file?)");
  if (length > file_size - 8 || length > bytes.size() - 8)
    throw InputError(file + ": truncated: the header is " + std::to_string(length) + " bytes but the file ends after " +
                     std::to_string(file_size - 8));
  return parse_header(what, bytes.substr(8, length), 8 + length, file_size);
}

Fd open_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) throw InputError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw InputError(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw InputError(path + ": not a regular file (a " +
                     (S_ISFIFO(st.st_mode)   ? "FIFO"
                      : S_ISDIR(st.st_mode)  ? "directory"
                      : S_ISCHR(st.st_mode)  ? "character device"
                      : S_ISBLK(st.st_mode)  ? "block device"
                      : S_ISSOCK(st.st_mode) ? "socket"
                                             : "special file") +
                     "); give the path of a .safetensors file");
  // A link is followed only where it is the caller's or root's (as fs.protected_symlinks does in
  // sticky directories): root loading from a directory another user can write must not read a
  // root-only file through that user's link. And the path must still name the file opened, so a
  // link swapped in after the open is seen too.
  struct stat at_path {};
  if (::lstat(path.c_str(), &at_path) != 0) throw InputError(path + ": cannot stat: " + std::strerror(errno));
  if (S_ISLNK(at_path.st_mode)) {
    if (at_path.st_uid != ::geteuid() && at_path.st_uid != 0)
      throw InputError(path + ": a symbolic link of another user (uid " + std::to_string(at_path.st_uid) +
                       "); a link is followed only when it is yours or root's: give the file's own path");
    if (::stat(path.c_str(), &at_path) != 0) throw InputError(path + ": cannot stat: " + std::strerror(errno));
  }
  if (at_path.st_dev != st.st_dev || at_path.st_ino != st.st_ino)
    throw InputError(path + ": the file changed while it was being opened (another file is there now)");
  // Reads of a regular file never wait on O_NONBLOCK, but take it off all the same.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

FileHeader read_header(const std::string& path) {
  const Fd fd = open_file(path);
  return read_header(fd.get(), path);
}

FileHeader read_header(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw InputError(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InputError(path + ": not a regular file");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  std::string bytes(8, '\0');
  auto read_at = [&](char* into, std::size_t n, std::uint64_t at) {
    std::size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd, into + done, n - done, static_cast<off_t>(at + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw InputError(path + ": cannot read: " + std::strerror(errno));
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  };
  bytes.resize(read_at(bytes.data(), 8, 0));
  if (bytes.size() == 8) {
    const std::uint64_t length = read_le64(bytes);
    // Bounded before anything is allocated for it; parse_file says what is wrong with the length.
    if (length <= kMaxHeader && length <= file_size - 8) {
      bytes.resize(8 + length);
      bytes.resize(8 + read_at(bytes.data() + 8, length, 8));
    }
  }
  return parse_file(path, bytes, file_size);
}

Index layout(const Index& file, std::uint64_t part_size) {
  Index out;
  out.metadata = file.metadata;
  part_size = std::max(part_size, kAlignment);
  std::uint64_t at = 0;  // the end of the last tensor in the open part
  for (const Tensor& t : file.tensors) {
    Tensor placed = t;
    std::uint64_t start = (at + kAlignment - 1) / kAlignment * kAlignment;
    if (at > 0 && (start > part_size || t.size > part_size - start)) {
      out.parts.push_back(at);
      if (out.parts.size() >= kMaxParts)
        throw InputError("the tensors need more than " + std::to_string(kMaxParts) + " parts of at most " +
                         format_bytes(part_size) + "; give a larger part size");
      at = start = 0;
    }
    placed.part = static_cast<std::uint32_t>(out.parts.size());
    placed.offset = start;
    at = start + t.size;
    out.tensors.push_back(std::move(placed));
  }
  out.parts.push_back(std::max<std::uint64_t>(at, 1));
  // Zero-size tensors placed at the same offset keep file order here but not by name: the index's
  // one order is the one a holder reads it back in (from_json), or the two would differ.
  std::sort(out.tensors.begin(), out.tensors.end(), by_place);
  return out;
}

std::uint64_t total_size(const Index& index) {
  std::uint64_t sum = 0;
  for (std::uint64_t p : index.parts) sum += p;
  return sum;
}

model::TensorEntry view(const Tensor& t) { return {t.name, t.dtype, t.shape, t.part, t.offset, t.size}; }

Json tensors_json(const Index& index) {
  Json tensors = Json::array();
  for (const Tensor& t : index.tensors) tensors.push_back(model::to_json(view(t)));
  return tensors;
}

Json metadata_json(const Index& index) {
  Json metadata = Json::object();
  for (const auto& [k, v] : index.metadata) metadata[k] = v;
  return metadata;
}

Json to_json(const Index& index) {
  return {{"tensors", tensors_json(index)}, {"metadata", metadata_json(index)}, {"parts", index.parts}};
}

Index from_json(const Json& tensors, const Json& metadata, const std::vector<std::uint64_t>& parts) {
  const Fail fail = [](const std::string& message) { throw Error(Errc::bad_request, "tensors: " + message); };
  if (!tensors.is_array()) fail("expected an array of {name, dtype, shape, part, offset_bytes, size_bytes}");
  if (tensors.size() > kMaxTensors) fail("more than " + std::to_string(kMaxTensors) + " tensors");
  Index out;
  std::vector<std::string> names;
  for (const Json& t : tensors) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) fail("each tensor needs \"name\", a string");
    out.tensors.push_back(read_entry(t["name"].get<std::string>(), t, "offset_bytes", fail));
    names.push_back(out.tensors.back().name);
  }
  std::sort(names.begin(), names.end());
  if (auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end())
    fail("two tensors are named \"" + valid_utf8(*dup) + "\"");
  out.metadata = read_metadata(metadata, fail);
  check_ranges(out.tensors, parts, "buffer", fail);
  out.parts = parts;
  return out;
}

}  // namespace cupool::tensors
