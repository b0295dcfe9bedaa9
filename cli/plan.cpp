// cupool plan / cupool apply: what the running holder would change to match a config file, and
// making those changes. The holder parses and checks the text; this side only reads the file.
#include <iostream>

#include "cli/holder_client.h"
#include "cli/holder_render.h"
#include "cli/options.h"
#include "cli/suggest.h"
#include "cli/verbs.h"
#include "config/config.h"
#include "config/diagnostics.h"
#include "model/fields.h"
#include "protocol/messages.h"

namespace cupool::cli {

namespace {

using json = nlohmann::ordered_json;

struct PlanArgs {
  std::string socket = kDefaultSocket;
  std::string format = "table";
  std::string config;
};

// A request carries at most this many payload bytes (docs/protocol.md, "Limits"). Over 64 KiB it
// goes in parts, which the holder takes from admins only: others are told so by the holder.
constexpr std::size_t kMaxRequest = std::size_t{4} << 20;
// Room left for the "id" the library adds.
constexpr std::size_t kIdRoom = 32;
// The longest "path" the holder takes (proto::kMaxConfigName): a longer one is sent as its end.
constexpr std::size_t kMaxPath = 256;

std::string shown_path(const std::string& path) {
  if (path.size() <= kMaxPath) return path;
  std::size_t from = path.size() - (kMaxPath - 3);
  while (from < path.size() && (static_cast<unsigned char>(path[from]) & 0xc0) == 0x80) ++from;  // a character's start
  return "..." + path.substr(from);
}

int run_plan(const PlanArgs& args, bool apply) {
  const Format format = parse_format(args.format);
  const char* op = apply ? "apply" : "plan";
  require_config(args.config, op);
  const SourceFile file = SourceFile::read(args.config, kMaxConfigBytes);

  const json request = proto::to_json(proto::Plan{file.text(), shown_path(file.path()), apply});
  const std::size_t size = request.dump(-1, ' ', false, json::error_handler_t::replace).size();
  if (size + kIdRoom > kMaxRequest)
    throw InputError(file.path() + ": too large to send to the holder: the request would be " + std::to_string(size) +
                     " bytes, and a request is at most 4 MiB (the config's text, JSON escapes included)");

  HolderClient holder = HolderClient::connect(args.socket, std::string("cupool ") + op);
  const json reply = holder.request_raw(request);
  if (const auto error = proto::error_of_reply(reply)) {
    // For scripts an invalid file's findings are data: print them as the reply has them.
    const std::string& code = error->code;
    if (format != Format::table && (code == "invalid_config" || code == "does_not_fit")) {
      print_reply(format, reply, render_plan);
      const std::string message = !error->message.empty()
                                      ? error->message
                                      : file.path() + (code == "invalid_config" ? ": not a valid cupool config"
                                                                                : ": does not fit the holder's node");
      throw Error::reported(code, message);
    }
    throw_reply_error(reply, op, std::string("cupool ") + op);
  }

  // Warnings and notes about the file, quoted against it like `cupool check` does.
  if (format == Format::table) {
    model::PlanReply plan;
    model::Seen seen;
    model::read_json_lenient(reply, plan, seen);
    if (seen.has(plan.warnings)) std::cerr << render_findings(model::write_json(plan.warnings), file);
  }
  print_reply(format, reply, render_plan);
  if (apply) return static_cast<int>(blocked_changes(reply) > 0 ? ExitCode::does_not_fit : ExitCode::ok);
  return static_cast<int>(change_count(reply) > 0 ? ExitCode::does_not_fit : ExitCode::ok);
}

Verb add_plan_like(CLI::App& app, bool apply) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* sub = apply ? app.add_subcommand("apply", "Make the running holder match a config file")
                        : app.add_subcommand("plan", "Show what 'apply' would change in the running holder, as a diff");
  if (apply) {
    sub->footer(
        "\n"
        "Send the config file to the running holder, which checks it against its node like 'cupool check'\n"
        "and makes every change that can be made: creates pools and buffers, updates pool attributes and\n"
        "access, replaces pools whose location, alloc_type, handle_types or max_size changed, removes what\n"
        "the file no longer has. A pool that still has leases or buffers is neither removed nor replaced,\n"
        "and a buffer that is open is not removed: such a change is blocked, and the answer says why.\n"
        "Applying the same file twice changes nothing the second time. Needs an admin (root or the\n"
        "holder's own user). The lines read like 'cupool plan' (+ create, ~ update, -/+ replace, - remove).\n"
        "\nExamples:\n"
        "  cupool plan pools.yaml && echo 'nothing to do'\n"
        "  sudo cupool apply pools.yaml\n"
        "  cupool export | sudo cupool apply -     # changes nothing\n"
        "\nExit codes: 0 every change was made (or there was none), 1 some change was blocked, or the file\n"
        "does not fit the holder's node (as in 'cupool check'; nothing applied, findings on stderr), 2 the\n"
        "file is invalid, 4 no holder is listening or it refused. With --format json the two 1s differ:\n"
        "a misfit prints error.code \"does_not_fit\" and its findings.");
  } else {
    sub->footer(
        "\n"
        "Send the config file to the running holder, which checks it against its node like 'cupool check'\n"
        "and answers what 'cupool apply' would change, one line per change; nothing is changed:\n"
        "  + pool scratch on device 1\n"
        "  ~ pool kv-cache on device 0: release_threshold 0 B -> max\n"
        "  -/+ pool kv-cache on device 1: max_size 32 GiB -> 64 GiB    (replaced: can't change on a live pool)\n"
        "  - pool old on device 0 (kept: 2 leases held by 1 client)   (blocked: apply will not make it)\n"
        "Like 'git diff --exit-code', the exit code says whether the holder has drifted from the file.\n"
        "Anyone who can open the holder's socket may ask.\n"
        "\nExamples:\n"
        "  cupool plan /etc/cupool/cupool.yaml\n"
        "  cupool plan pools.yaml --format json | jq '.changes[] | select(.blocked)'\n"
        "  cupool plan pools.yaml || sudo cupool apply pools.yaml\n"
        "\nExit codes: 0 no changes (the holder matches the file), 1 there are changes (drift), or the\n"
        "file does not fit the holder's node (as in 'cupool check'; findings on stderr), 2 the file is\n"
        "invalid, 4 no holder is listening or it refused. With --format json the two 1s differ: a misfit\n"
        "prints error.code \"does_not_fit\" and its findings, drift prints changes.");
  }
  sub->add_option("config", args->config, "The config file ('-' reads standard input)")->required();
  add_socket_option(sub, args->socket);
  add_format_option(sub, args->format);
  return {sub, [args, apply](Context&) { return run_plan(*args, apply); }};
}

}  // namespace

Verb add_plan(CLI::App& app) { return add_plan_like(app, false); }
Verb add_apply(CLI::App& app) { return add_plan_like(app, true); }

}  // namespace cupool::cli
