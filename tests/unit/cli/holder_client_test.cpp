#include "cli/holder_client.h"

#include <doctest/doctest.h>

#include <string>

using Json = nlohmann::ordered_json;

namespace {

// The message of the error throw_reply_error throws for the holder's `message` to request `op`
// sent by the command `verb`.
std::string refused(const std::string& message, const std::string& op, const std::string& verb) {
  const Json reply = {{"id", 1}, {"ok", false}, {"error", {{"code", "not_permitted"}, {"message", message}}}};
  try {
    cupool::cli::throw_reply_error(reply, op, verb);
  } catch (const cupool::Error& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

}  // namespace

TEST_CASE("throw_reply_error: the holder's name for a request becomes the command the user typed") {
  CHECK(refused("buffer_create needs the holder's user or root; you are alice", "buffer_create",
                "cupool buffer create") == "cupool buffer create needs the holder's user or root; you are alice");
  CHECK(refused("the holder is stopping and takes no new buffer_create requests", "buffer_create",
                "cupool buffer load") == "the holder is stopping and takes no new cupool buffer load requests");
  CHECK(refused("trim needs the holder's user or root; you are alice", "trim", "cupool trim") ==
        "cupool trim needs the holder's user or root; you are alice");
  CHECK(refused("stats with reset_peaks needs the holder's user or root; you are alice", "stats", "cupool stats") ==
        "cupool stats --reset-peaks needs the holder's user or root; you are alice");
  // A word that only contains the request's name, a message without it, and no command: left alone.
  CHECK(refused("no pool named \"trimmed\"", "trim", "cupool trim") == "no pool named \"trimmed\"");
  CHECK(refused("pool kv has no room", "buffer_create", "cupool buffer create") == "pool kv has no room");
  CHECK(refused("buffer_create needs it", "buffer_create", "") == "buffer_create needs it");
}
