// A reply of the holder read into its model object for the text renderers (holder_render.cpp,
// plan_render.cpp): what it had, and "-" for what it did not.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "base/text.h"
#include "base/units.h"
#include "model/fields.h"
#include "model/model.h"

namespace cupool::render {

using json = nlohmann::ordered_json;

inline const char* const kNone = "-";

// A member of a reply read into its model object, for people: "-" where the reply did not have
// it (or had it ill-typed: model::read_json_lenient passes such a value over).
class Shown {
 public:
  explicit Shown(const model::Seen& seen) : seen_(seen) {}
  template <class T>
  bool has(const T& member) const {
    return seen_.has(member);
  }
  template <class P, class T>
  bool has_part(const T& value) const {
    return seen_.has_part<P>(value);
  }
  std::string text(const std::string& v) const { return has(v) ? valid_utf8(v) : kNone; }
  std::string text(const std::optional<std::string>& v) const { return has(v) && v ? valid_utf8(*v) : kNone; }
  template <class N>
  std::string number(const N& v) const {
    return has(v) ? std::to_string(v) : kNone;
  }
  template <class N>
  std::string number(const std::optional<N>& v) const {
    return has(v) && v ? std::to_string(*v) : kNone;
  }
  std::string bytes(const std::uint64_t& v) const { return has(v) ? format_bytes(v) : kNone; }
  // A release threshold as reports spell it ("75%", "max"), where the reply had its text.
  std::string threshold(const ReleaseThreshold& t) const {
    return has_part<model::ThresholdText>(t) ? valid_utf8(t.text()) : kNone;
  }
  // "3 (192 MiB)": a count and the bytes behind it.
  std::string count_and_bytes(const std::uint64_t& count, const std::uint64_t& bytes) const {
    return number(count) + (has(bytes) ? " (" + format_bytes(bytes) + ")" : "");
  }

 private:
  const model::Seen& seen_;
};

// A reply read once into its model object, with what it had; it stays where it is (Seen holds the
// members' addresses).
template <class T>
struct Read {
  explicit Read(const json& reply) : shown(seen) { model::read_json_lenient(reply, value, seen); }
  Read(const Read&) = delete;
  Read& operator=(const Read&) = delete;
  T value;
  model::Seen seen;
  Shown shown;
};

}  // namespace cupool::render
