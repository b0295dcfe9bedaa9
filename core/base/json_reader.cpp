#include "base/json_reader.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/text.h"

namespace cupool {

namespace {

using Json = nlohmann::ordered_json;
// An ordered_json object is a vector of (key, value) pairs; appending to it directly skips the
// linear search that operator[] and emplace do (duplicates are refused here first).
using Pairs = std::vector<std::pair<const std::string, Json>>;

class Builder : public nlohmann::json_sax<Json> {
 public:
  explicit Builder(const JsonLimits& limits) : limits_(limits) {}

  bool null() override { return value(nullptr); }
  bool boolean(bool v) override { return value(v); }
  bool number_integer(number_integer_t v) override { return value(v); }
  bool number_unsigned(number_unsigned_t v) override { return value(v); }
  bool number_float(number_float_t v, const string_t&) override { return value(v); }
  bool string(string_t& v) override { return value(std::move(v)); }
  bool binary(binary_t&) override { return fail("binary values are not JSON"); }

  bool start_object(std::size_t) override { return open(Json::object()); }
  bool key(string_t& k) override {
    Level& level = stack_.back();
    if (++level.keys > limits_.max_keys)
      return fail(limits_.too_many_keys ? limits_.too_many_keys
                                        : "has an object of more than " + std::to_string(limits_.max_keys) + " keys");
    if (!level.seen.insert(k).second) return fail("has the key \"" + valid_utf8(k) + "\" twice in one object");
    auto& pairs = static_cast<Pairs&>(level.value->get_ref<Json::object_t&>());
    pairs.emplace_back(std::move(k), nullptr);
    slot_ = &pairs.back().second;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_array() override { return close(); }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    // nlohmann's message names the byte and what it expected; keep it, without its prefix.
    std::string what = e.what();
    if (const auto at = what.find("] "); at != std::string::npos) what.erase(0, at + 2);
    return fail("is not valid JSON (at byte " + std::to_string(position) + ": " + what + ")");
  }

  Json take() { return std::move(root_); }
  const std::string& error() const { return error_; }

 private:
  struct Level {
    Json* value;
    std::size_t keys = 0;
    // Ordered, not hashed: keys chosen to share one bucket of a fixed-seed hash would make a hashed
    // set's inserts linear each (100,000 such keys in a tensor header took 343 s); a tree's stay
    // logarithmic whatever the keys.
    std::set<std::string, std::less<>> seen;  // an array's stays empty
  };

  // Where the next value goes: the root, the end of the open array, or the key just read.
  Json* place(Json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json* top = stack_.back().value;
    if (top->is_array()) {
      top->get_ref<Json::array_t&>().push_back(std::move(v));
      return &top->get_ref<Json::array_t&>().back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool value(Json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(Json&& container) {
    if (stack_.size() >= limits_.max_depth)
      return fail("nests deeper than " + std::to_string(limits_.max_depth) + " levels");
    Json* at = place(std::move(container));
    stack_.push_back(Level{at, 0, {}});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }
  bool fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  const JsonLimits& limits_;
  Json root_;
  std::vector<Level> stack_;
  Json* slot_ = nullptr;
  std::string error_;
};

}  // namespace

nlohmann::ordered_json read_json(std::string_view text, const JsonLimits& limits) {
  Builder builder(limits);
  if (!Json::sax_parse(text.begin(), text.end(), &builder)) {
    throw JsonReadError(builder.error().empty() ? std::string("is not valid JSON") : builder.error());
  }
  return builder.take();
}

}  // namespace cupool
