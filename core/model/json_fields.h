// The machinery that makes a declared object's JSON writer, readers and list of names from its
// declaration (`CUPOOL_FIELDS(T) { f("name", v.member) ... }`; the forms are listed in
// model/fields.h, which holds the model's declarations). A declaration may live in any namespace
// (custody's do): the visitors find it by argument-dependent lookup where they are used.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include "model/model.h"

namespace cupool::model {

struct OmitEmpty {};
inline constexpr OmitEmpty omit_empty{};
struct Defaulted {};
inline constexpr Defaulted defaulted{};

// `template <class F> void fields(F& f, X& v)` for X and const X.
#define CUPOOL_FIELDS(T)                                                                            \
  template <class F, class V, std::enable_if_t<std::is_same_v<std::remove_const_t<V>, T>, int> = 0> \
  void fields(F& f, V& v)

// What a reader throws about its input: the key's path ("devices[0].memory.total_bytes") and what
// is wrong with it ("missing", "is not a string"); what() says both (`missing "PATH"`,
// `"PATH" is not a string`).
class FieldError : public std::invalid_argument {
 public:
  FieldError(std::string path, std::string problem, const std::string& what)
      : std::invalid_argument(what), path_(std::move(path)), problem_(std::move(problem)) {}
  const std::string& path() const { return path_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string path_, problem_;
};

// The visitors' base: a declaration in this namespace for a type of another (model::Usage is
// base's MemoryUsage) is found through it by argument-dependent lookup, so this header need not
// follow the declarations.
struct Visitor {};

// What a reader found in its input: the members it read (by address and type, so a struct and
// its first member differ). A renderer asks it whether a reply had a field at all.
class Seen {
 public:
  template <class T>
  void add(const T& member) {
    had_.emplace(static_cast<const void*>(&member), std::type_index(typeid(T)));
  }
  template <class T>
  bool has(const T& member) const {
    return had_.count({static_cast<const void*>(&member), std::type_index(typeid(T))}) > 0;
  }
  // A part P of a value read through f.part (a ReleaseThreshold's text or bytes).
  template <class P, class T>
  void add_part(const T& value) {
    had_.emplace(static_cast<const void*>(&value), std::type_index(typeid(P)));
  }
  template <class P, class T>
  bool has_part(const T& value) const {
    return had_.count({static_cast<const void*>(&value), std::type_index(typeid(P))}) > 0;
  }

 private:
  std::set<std::pair<const void*, std::type_index>> had_;
};

namespace io {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};

// Whether T has a declaration above.
struct AnyVisitor : Visitor {
  template <class... A>
  void operator()(const char*, A&&...) {}
  template <class T>
  void flat(T&) {}
  template <class B>
  void object(const char*, B&&) {}
  template <class T>
  void computed(const char*, const T&) {}
  template <class T, class W, class R>
  void custom(const char*, T&, W, R) {}
  template <class T>
  void only_if(bool, const char*, T&) {}
  template <class T, class W, class R>
  void old_name(const char*, T&, W, R) {}
  template <class T, class P>
  void part(const char*, T&, P) {}
};
template <class T, class = void>
struct declared : std::false_type {};
template <class T>
struct declared<T, std::void_t<decltype(fields(std::declval<AnyVisitor&>(), std::declval<T&>()))>> : std::true_type {};

class Writer : Visitor {
 public:
  explicit Writer(Json& out) : out_(out) {}
  template <class T>
  void operator()(const char* name, const T& v) {
    out_[name] = value(v);
  }
  template <class T>
  void operator()(const char* name, const std::optional<T>& v, OmitEmpty) {
    if (v) out_[name] = value(*v);
  }
  template <class T, class Rule>
  void operator()(const char* name, const T& v, const Rule&) {
    static_assert(!std::is_same_v<Rule, OmitEmpty>, "omit_empty is for an optional");
    (*this)(name, v);
  }
  template <class T>
  void flat(const T& v) {
    if constexpr (is_optional<T>::value) {
      if (v) fields(*this, *v);
    } else {
      fields(*this, v);
    }
  }
  template <class Body>
  void object(const char* name, Body&& body) {
    Json sub = Json::object();
    Writer w(sub);
    body(w);
    out_[name] = std::move(sub);
  }
  template <class T>
  void computed(const char* name, const T& v) {
    out_[name] = value(v);
  }
  template <class T, class W, class R>
  void custom(const char* name, const T& v, W write, R) {
    out_[name] = write(v);
  }
  template <class T>
  void only_if(bool cond, const char* name, const T& v) {
    if (cond) (*this)(name, v);
  }
  template <class T, class W, class R>
  void old_name(const char* name, const T& v, W write_old, R) {
    Json old = write_old(v);
    if (!old.is_discarded()) out_[name] = std::move(old);
  }
  template <class T, class P>
  void part(const char* name, const T& v, P) {
    out_[name] = value(P::get(v));
  }

  template <class T>
  static Json value(const T& v) {
    if constexpr (is_optional<T>::value) {
      return v ? value(*v) : Json(nullptr);
    } else if constexpr (is_vector<T>::value) {
      Json out = Json::array();
      for (const auto& e : v) out.push_back(value(e));
      return out;
    } else if constexpr (declared<T>::value) {
      Json out = Json::object();
      Writer w(out);
      fields(w, v);
      return out;
    } else {
      return Json(v);
    }
  }

 private:
  Json& out_;
};

// Reads what a Writer wrote. Unknown keys are ignored. Tolerant: a missing key keeps the member's
// default (a holder of another version may omit it); strict: a missing key that is neither optional
// nor `defaulted` is an error. Either way an ill-typed value throws FieldError (an
// std::invalid_argument) naming the key, except when lenient (for display): there an ill-typed
// value is passed over as if it were missing.
// With `seen`, every member read is recorded there (what the input had).
class Reader : Visitor {
 public:
  enum class Mode { tolerant, strict, lenient };
  Reader(const Json& in, Mode mode, std::string prefix = {}, Seen* seen = nullptr)
      : in_(in), mode_(mode), prefix_(std::move(prefix)), seen_(seen) {}

  template <class T>
  void operator()(const char* name, T& v) {
    value(name, v, !is_optional<T>::value);
  }
  template <class T>
  void operator()(const char* name, T& v, Defaulted) {
    value(name, v, false);
  }
  template <class T>
  void operator()(const char* name, std::optional<T>& v, OmitEmpty) {
    (*this)(name, v);
  }
  template <class T, class Rule>
  void operator()(const char* name, T& v, const Rule&) {
    static_assert(!std::is_same_v<Rule, OmitEmpty>, "omit_empty is for an optional");
    (*this)(name, v);
  }
  template <class T>
  void flat(T& v) {
    if constexpr (is_optional<T>::value) {
      // Present when any of its keys is.
      typename T::value_type probe{};
      Reader any(in_, Mode::tolerant, prefix_);
      fields(any, probe);
      if (any.found_ == 0) return;
      v.emplace();
      fields(*this, *v);
    } else {
      fields(*this, v);
    }
  }
  template <class Body>
  void object(const char* name, Body&& body) {
    const Json* j = find(name, true);
    if (!j) return;
    if (!j->is_object()) {
      if (mode_ == Mode::lenient) return;
      fail(prefix_ + name, "an object");
    }
    Reader sub(*j, mode_, prefix_ + name + ".", seen_);
    body(sub);
  }
  template <class T>
  void computed(const char*, const T&) {}
  template <class T>
  void only_if(bool cond, const char* name, T& v) {
    if (cond) (*this)(name, v);
  }
  template <class T, class W, class R>
  void custom(const char* name, T& v, W, R read_custom) {
    const Json* j = find(name, true);
    if (!j) return;
    try {
      v = read_custom(*j);
    } catch (const std::exception& e) {
      if (mode_ == Mode::lenient) return;
      throw FieldError(prefix_ + name, e.what(), "\"" + prefix_ + name + "\": " + e.what());
    }
    mark(v);
  }
  // The member's old name, read only where the new one left it empty (an older writer's reply).
  template <class T, class W, class R>
  void old_name(const char* name, std::optional<T>& v, W, R read_old) {
    if (v) return;
    const Json* j = find(name, false);
    if (!j) return;
    try {
      v = read_old(*j);
    } catch (const std::exception& e) {
      if (mode_ == Mode::lenient) return;
      throw FieldError(prefix_ + name, e.what(), "\"" + prefix_ + name + "\": " + e.what());
    }
    if (v) mark(v);
  }
  // A part of a value type, read as P::get's type and given to P::set.
  template <class T, class P>
  void part(const char* name, T& v, P) {
    using Part = std::decay_t<decltype(P::get(v))>;
    const Json* j = find(name, !is_optional<Part>::value);
    if (!j) return;
    Part p{};
    Reader quiet(in_, mode_, prefix_);  // `seen` records the part, not this local
    try {
      quiet.read(*j, p, prefix_ + name);
    } catch (const std::invalid_argument&) {
      if (mode_ != Mode::lenient) throw;
      return;  // passed over: shown as missing
    }
    P::set(v, std::move(p));
    if (seen_) seen_->add_part<P>(v);
  }

 private:
  template <class T>
  void value(const char* name, T& v, bool required) {
    const Json* j = find(name, required);
    if (!j) return;
    if (mode_ != Mode::lenient) return read(*j, v, prefix_ + name);
    try {
      read(*j, v, prefix_ + name);
    } catch (const std::invalid_argument&) {
      // passed over: shown as missing
    }
  }
  const Json* find(const char* name, bool required) {
    if (!in_.is_object())
      fail(prefix_.empty() ? std::string("the reply") : prefix_.substr(0, prefix_.size() - 1), "an object");
    const auto it = in_.find(name);
    if (it == in_.end()) {
      if (required && mode_ == Mode::strict)
        throw FieldError(prefix_ + name, "missing", "missing \"" + prefix_ + name + "\"");
      return nullptr;
    }
    ++found_;
    return &*it;
  }
  [[noreturn]] static void fail(const std::string& where, const char* what) {
    throw FieldError(where, std::string("is not ") + what, "\"" + where + "\" is not " + what);
  }
  template <class T>
  void mark(const T& v) {
    if (seen_) seen_->add(v);
  }

  template <class T>
  void read(const Json& j, T& v, const std::string& where) {
    if constexpr (is_optional<T>::value) {
      if (j.is_null()) {
        v.reset();
      } else {
        read(j, v.emplace(), where);
      }
    } else if constexpr (is_vector<T>::value) {
      if (!j.is_array()) fail(where, "an array");
      T out(j.size());
      for (std::size_t i = 0; i < j.size(); ++i) {
        if constexpr (std::is_same_v<typename T::value_type, bool>) {
          bool x = false;
          read(j[i], x, where + "[" + std::to_string(i) + "]");
          out[i] = x;
        } else {
          read(j[i], out[i], where + "[" + std::to_string(i) + "]");  // in place: `seen` keeps its address
        }
      }
      v = std::move(out);
    } else if constexpr (declared<T>::value) {
      if (!j.is_object()) fail(where, "an object");
      Reader sub(j, mode_, where + ".", seen_);
      fields(sub, v);
    } else if constexpr (std::is_same_v<T, Json>) {
      v = j;
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!j.is_boolean()) fail(where, "a boolean");
      v = j.get<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!j.is_string()) fail(where, "a string");
      v = j.get<std::string>();
    } else if constexpr (std::is_same_v<T, std::map<std::string, std::string>>) {
      if (!j.is_object()) fail(where, "an object");
      T out;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!it.value().is_string()) fail(where + "." + it.key(), "a string");
        out[it.key()] = it.value().template get<std::string>();
      }
      v = std::move(out);
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!j.is_number()) fail(where, "a number");
      v = j.get<T>();
    } else if constexpr (std::is_unsigned_v<T>) {
      if (!(j.is_number_unsigned() || (j.is_number_integer() && j.get<std::int64_t>() >= 0)) ||
          j.get<std::uint64_t>() > std::numeric_limits<T>::max())
        fail(where, "a non-negative integer");
      v = static_cast<T>(j.get<std::uint64_t>());
    } else {
      static_assert(std::is_integral_v<T>, "a member of a type the reader does not know");
      if (!j.is_number_integer() ||
          (j.is_number_unsigned() &&
           j.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) ||
          (!j.is_number_unsigned() && (j.get<std::int64_t>() < std::numeric_limits<T>::min() ||
                                       j.get<std::int64_t>() > std::numeric_limits<T>::max())))
        fail(where, "an integer");
      v = static_cast<T>(j.get<std::int64_t>());
    }
    mark(v);
  }

  const Json& in_;
  Mode mode_;
  std::string prefix_;
  Seen* seen_;
  std::size_t found_ = 0;
};

// The JSON names of T in their order (a flat member's names in place; a nested object's name, not
// its members'), or with `inside`, the names of its nested object of that name.
class Names : Visitor {
 public:
  explicit Names(const char* inside = nullptr) : inside_(inside) {}
  template <class... A>
  void operator()(const char* name, A&&...) {
    add(name);
  }
  template <class T>
  void flat(T&) {
    if constexpr (is_optional<T>::value) {
      typename T::value_type probe{};
      fields(*this, probe);
    } else {
      std::remove_const_t<T> probe{};
      fields(*this, probe);
    }
  }
  template <class B>
  void object(const char* name, B&& body) {
    add(name);
    if (inside_ && std::string(inside_) == name) {
      Names sub;
      body(sub);
      names = std::move(sub.names);
    }
  }
  template <class T>
  void computed(const char* name, const T&) {
    add(name);
  }
  template <class T, class W, class R>
  void custom(const char* name, T&, W, R) {
    add(name);
  }
  template <class T>
  void only_if(bool, const char* name, T&) {
    add(name);
  }
  template <class T, class W, class R>
  void old_name(const char* name, T&, W, R) {
    add(name);
  }
  template <class T, class P>
  void part(const char* name, T&, P) {
    add(name);
  }
  std::vector<std::string> names;

 private:
  void add(const char* name) {
    if (!inside_) names.emplace_back(name);
  }
  const char* inside_;
};

}  // namespace io

// Each declared object's JSON names, in order, or those of its nested object `inside` (tests hold
// them against the schemas).
template <class T>
std::vector<std::string> json_names(const char* inside = nullptr) {
  io::Names n(inside);
  T probe{};
  fields(n, probe);
  return n.names;
}

// A declared object from JSON our own holder or tool wrote: unknown keys ignored, missing ones
// kept at their defaults; throws std::invalid_argument naming an ill-typed key. With `seen`, what
// the input had is recorded there (out must then stay where it is).
template <class T>
void read_json(const Json& j, T& out, Seen* seen = nullptr) {
  io::Reader r(j, io::Reader::Mode::tolerant, {}, seen);
  fields(r, out);
}
template <class T>
T read_json(const Json& j) {
  T out{};
  read_json(j, out);
  return out;
}
// For display: what the input had, each ill-typed value passed over as if missing (never throws
// on content); `seen` says which members it had.
template <class T>
void read_json_lenient(const Json& j, T& out, Seen& seen) {
  if (!j.is_object()) return;
  io::Reader r(j, io::Reader::Mode::lenient, {}, &seen);
  fields(r, out);
}
// The same, with every key that is not optional required.
template <class T>
T read_json_strict(const Json& j) {
  T out{};
  io::Reader r(j, io::Reader::Mode::strict);
  fields(r, out);
  return out;
}
// A declared object's JSON.
template <class T>
Json write_json(const T& v) {
  return io::Writer::value(v);
}
// The reader in nlohmann's form (read_json), so `j.get<model::X>()` works too.
template <class T, std::enable_if_t<io::declared<T>::value, int> = 0>
void from_json(const Json& j, T& v) {
  v = read_json<T>(j);
}

}  // namespace cupool::model
