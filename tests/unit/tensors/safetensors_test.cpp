#include "tensors/safetensors.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "base/error.h"

using namespace cupool;
using namespace cupool::tensors;

namespace {

// A file's bytes: the 8-byte little-endian length, the header text, `data` bytes of data.
std::string file(const std::string& header, std::size_t data = 0) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data, '\x01');
}

FileHeader parse(const std::string& header, std::size_t data = 0) {
  const std::string bytes = file(header, data);
  return parse_file("m.safetensors", bytes, bytes.size());
}

// The message parse() fails with ("" when it does not).
std::string refusal(const std::string& header, std::size_t data = 0) {
  try {
    parse(header, data);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

Tensor tensor(const std::string& name, std::uint64_t size, std::uint64_t offset = 0) {
  Tensor t;
  t.name = name;
  t.dtype = "U8";
  t.shape = {size};
  t.offset = offset;
  t.size = size;
  return t;
}

}  // namespace

TEST_CASE("safetensors: a header is read into an index sorted by offset") {
  const FileHeader h = parse(R"({"b": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]},
    "a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
    "e": {"dtype": "F16", "shape": [0, 3], "data_offsets": [24, 24]},
    "__metadata__": {"format": "pt"}})",
                             24);
  REQUIRE(h.index.tensors.size() == 3);
  CHECK(h.index.tensors[0].name == "a");
  CHECK(h.index.tensors[1].name == "b");
  CHECK(h.index.tensors[1].shape == std::vector<std::uint64_t>{2, 2});
  CHECK(h.index.tensors[1].size == 16);
  CHECK(h.index.tensors[2].size == 0);
  CHECK(h.index.metadata.at("format") == "pt");
  CHECK(h.data_size == 24);
  CHECK(h.data_start > 8);
}

TEST_CASE("safetensors: bad files are refused naming the file and what is wrong") {
  const auto says = [](const std::string& message, const std::string& words) {
    CHECK_MESSAGE(message.find("m.safetensors: ") == 0, message);
    CHECK_MESSAGE(message.find(words) != std::string::npos, message);
  };
  CHECK_THROWS_WITH_AS(parse_file("m.safetensors", "abc", 3), doctest::Contains("truncated"), InputError);
  std::string huge(8, '\0');
  huge[5] = 1;  // 2^40
  CHECK_THROWS_WITH_AS(parse_file("m.safetensors", huge + "{}", 10), doctest::Contains("at most"), InputError);
  says(refusal("hello"), "not valid JSON");
  says(refusal("[1, 2]"), "not a JSON object");
  says(refusal(R"({"w": {"dtype": "F12", "shape": [1], "data_offsets": [0, 1]}})", 1), "unknown dtype \"F12\"");
  says(refusal(R"({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})", 1), "unknown dtype \"F4\"");
  says(refusal(R"({"w": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}})", 16),
       "is 20 bytes, but its offsets span 16");
  says(refusal(R"({"w": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}})", 8), "past the end of the data");
  says(refusal(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [8, 4]}})", 8), "end before they begin");
  says(refusal(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                   "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})",
               8),
       "tensors \"a\" and \"b\" overlap");
  says(refusal(R"({"a\u0001": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}})"), "control characters");
  says(refusal(R"({"": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}})"), "empty name");
  says(refusal(R"({"w": {"dtype": "U8", "shape": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], "data_offsets": [0, 1]}})", 1),
       "at most 16 dimensions");
  says(refusal(R"({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}})", 1), "integers of 0 or more");
  says(refusal(R"({"w": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})"),
       "more than 2^64 bytes");
  says(refusal(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0]}})", 1), "needs \"data_offsets\"");
  says(refusal(R"({"w": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}}})"), "nests deeper");
  says(refusal(R"({"__metadata__": {"k": 1}})"), "values must be strings");
  says(refusal(R"({"__metadata__": {"k": ")" + std::string(kMaxMetadata, 'x') + R"("}})"),
       "__metadata__ holds more than");
  // The header's length says more than the file has.
  std::string cut = file(R"({"a": 1})");
  cut[0] = 100;
  CHECK_THROWS_WITH_AS(parse_file("m.safetensors", cut, cut.size()), doctest::Contains("truncated"), InputError);
}

TEST_CASE("safetensors: layout aligns each tensor and keeps file order") {
  Index file;
  file.tensors = {tensor("a", 10, 0), tensor("b", 300, 10), tensor("empty", 0, 310), tensor("c", 1, 310)};
  const Index placed = layout(file);
  REQUIRE(placed.parts.size() == 1);
  CHECK(placed.tensors[0].offset == 0);
  CHECK(placed.tensors[1].offset == 256);
  CHECK(placed.tensors[2].offset == 768);
  CHECK(placed.tensors[3].offset == 768);
  CHECK(placed.parts[0] == 769);
  CHECK(total_size(placed) == 769);
  CHECK(layout(Index{}).parts == std::vector<std::uint64_t>{1});  // no tensors: one byte
}

TEST_CASE("safetensors: layout splits a set into parts of at most the part size") {
  Index file;
  file.tensors = {tensor("a", 500), tensor("b", 300), tensor("c", 2000), tensor("d", 100), tensor("e", 100)};
  const Index placed = layout(file, 1024);
  // a and b fit one part (at 0 and 512); c is larger than a part: its own; d and e share the next.
  REQUIRE(placed.parts.size() == 3);
  CHECK(placed.parts == std::vector<std::uint64_t>{812, 2000, 356});
  CHECK(placed.tensors[1].part == 0);
  CHECK(placed.tensors[1].offset == 512);
  CHECK(placed.tensors[2].part == 1);
  CHECK(placed.tensors[2].offset == 0);
  CHECK(placed.tensors[3].part == 2);
  CHECK(placed.tensors[4].offset == 256);
  Index many;
  for (std::size_t i = 0; i <= kMaxParts; ++i) many.tensors.push_back(tensor("t" + std::to_string(i), 1000));
  const std::string too_many = "more than " + std::to_string(kMaxParts) + " parts";
  CHECK_THROWS_WITH_AS(layout(many, 1024), doctest::Contains(too_many.c_str()), InputError);
  CHECK(layout(many, 1 << 20).parts.size() == 2);  // 1024 tensors of 1000 bytes (1024 apart) a part
}

TEST_CASE("safetensors: the index travels as JSON and the holder reads it back the same") {
  Index file;
  file.tensors = {tensor("a", 500), tensor("b", 300), tensor("c", 2000)};
  file.metadata = {{"format", "pt"}};
  const Index placed = layout(file, 1024);
  const Json j = to_json(placed);
  CHECK(j["parts"] == Json::array({812, 2000}));
  CHECK(j["tensors"][2]["part"] == 1);
  const Index back = from_json(j["tensors"], j["metadata"], placed.parts);
  REQUIRE(back.tensors.size() == 3);
  CHECK(back.tensors[2].name == "c");
  CHECK(back.tensors[2].part == 1);
  CHECK(back.metadata == placed.metadata);
  CHECK(back.parts == placed.parts);
}

TEST_CASE("safetensors: an index a peer sends is checked like a file, within each part") {
  const auto refused = [](const std::string& tensors, const std::vector<std::uint64_t>& parts) -> std::string {
    try {
      from_json(Json::parse(tensors), Json(), parts);
    } catch (const Error& e) {
      CHECK(std::string(e.wire_code()) == "bad_request");
      return e.what();
    }
    return "";
  };
  CHECK(refused(R"([{"name": "a", "dtype": "U8", "shape": [4], "offset_bytes": 0, "size_bytes": 4},
                    {"name": "a", "dtype": "U8", "shape": [4], "offset_bytes": 256, "size_bytes": 4}])",
                {1024})
            .find("two tensors are named \"a\"") != std::string::npos);
  CHECK(
      refused(R"([{"name": "a", "dtype": "U8", "shape": [4], "part": 1, "offset_bytes": 0, "size_bytes": 4}])", {1024})
          .find("is in part 1, but the buffer has 1 part") != std::string::npos);
  CHECK(
      refused(R"([{"name": "a", "dtype": "U8", "shape": [4], "part": -1, "offset_bytes": 0, "size_bytes": 4}])", {1024})
          .find("\"part\" is the number of a part") != std::string::npos);
  CHECK(refused(R"([{"name": "a", "dtype": "U8", "shape": [8], "part": 1, "offset_bytes": 0, "size_bytes": 8}])",
                {1024, 4})
            .find("past the end of the buffer (4 bytes)") != std::string::npos);
  CHECK(refused(R"({"a": 1})", {1024}).find("expected an array") != std::string::npos);
  // No "part": the first; the same offsets in two parts do not overlap.
  const Index ok =
      from_json(Json::parse(R"([{"name": "a", "dtype": "U8", "shape": [8], "offset_bytes": 0, "size_bytes": 8},
    {"name": "b", "dtype": "U8", "shape": [8], "part": 1, "offset_bytes": 0, "size_bytes": 8}])"),
                Json(), {8, 8});
  CHECK(ok.tensors[0].part == 0);
  CHECK(ok.tensors[1].part == 1);
}

TEST_CASE("safetensors: a name twice, names and metadata that would not display as themselves (issue 22)") {
  const auto says = [](const std::string& message, const std::string& words) {
    CHECK_MESSAGE(message.find("m.safetensors: ") == 0, message);
    CHECK_MESSAGE(message.find(words) != std::string::npos, message);
  };
  // The last one used to win.
  says(refusal(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                   "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
               2),
       "has the key \"w\" twice");
  for (const char* name : {"a\\u007f", "a\\u009b31m", "evil\\u202egnp", "a\\u2066b", "x\\u001b]0;t"})
    says(refusal(std::string(R"({")") + name + R"(": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}})"),
         "a name is printable UTF-8 text");
  says(refusal(R"({"__metadata__": {"k": "\u001b[2J"}})"), "may hold only tab and newline");
  says(refusal(R"({"__metadata__": {"k\u202e": "v"}})"), "a key is printable");
  const FileHeader ok = parse(R"({"caf\u00e9 \u4e2d": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]},
    "__metadata__": {"notes": "two\nlines\tand a tab"}})");
  CHECK(ok.index.tensors[0].name == "caf\xc3\xa9 \xe4\xb8\xad");
  CHECK(ok.index.metadata.at("notes") == "two\nlines\tand a tab");
}

TEST_CASE("safetensors: many tensors are read in linear time and the count is bounded while reading") {
  // 80,000 names took 6.4 s (a linear search per key), and the count was checked after parsing.
  std::string header = "{";
  for (int i = 0; i < 80000; ++i)
    header += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]})";
  header += "}";
  const FileHeader h = parse(header);
  CHECK(h.index.tensors.size() == 80000);
  std::string over = "{";
  for (std::size_t i = 0; i <= kMaxTensors + 1; ++i) over += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(": 1)";
  over += ", this is not JSON";
  // Stopped at the bound: the text after it is never read.
  CHECK(refusal(over).find("has more than 100000 tensors") != std::string::npos);
}

TEST_CASE("safetensors: zero-size tensors at one offset read back the same (issue 22, the fuzzer's case)") {
  // {"s": U8 [0] at [0,0], "a": F32 [0,5] at [8,8], "x": I8 [3] at [8,11]}: layout put s and a at
  // offset 0 in file order (s, a), the holder read them back by name (a, s).
  const FileHeader h = parse(R"({"s": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]},
    "a": {"dtype": "F32", "shape": [0, 5], "data_offsets": [8, 8]},
    "x": {"dtype": "I8", "shape": [3], "data_offsets": [8, 11]}})",
                             11);
  for (std::uint64_t part_size : {kDefaultPartSize, std::uint64_t{1}}) {
    const Index placed = layout(h.index, part_size);
    const Json j = to_json(placed);
    const Index back = from_json(j["tensors"], j["metadata"], placed.parts);
    REQUIRE(back.tensors.size() == placed.tensors.size());
    for (std::size_t i = 0; i < back.tensors.size(); ++i) {
      CHECK(back.tensors[i].name == placed.tensors[i].name);
      CHECK(back.tensors[i].offset == placed.tensors[i].offset);
    }
  }
}
