// cupool export: the running holder's live state as a config file.
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <iostream>

#include "base/output.h"
#include "cli/holder_client.h"
#include "cli/verbs.h"
#include "model/fields.h"
#include "protocol/messages.h"

namespace cupool::cli {

namespace {

struct ExportArgs {
  std::string socket = kDefaultSocket;
  std::string output = "-";
  std::string format = "yaml";
};

// The holder's config text as JSON: the same document, which check and apply read alike (a JSON
// document is YAML too).
std::string as_json(const std::string& yaml_text) {
  try {
    return dump_json(yaml_to_json(YAML::Load(yaml_text))) + "\n";
  } catch (const YAML::Exception& e) {
    throw Error(Errc::unreachable, std::string("the holder sent an export that is not YAML: ") + e.what());
  }
}

}  // namespace

Verb add_export(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* sub = app.add_subcommand("export", "Write the running holder's live state as a config file");
  sub->footer(
      "\n"
      "Ask the running holder for its live state (holder settings, pools, buffers) written as a version 1\n"
      "config, which 'cupool check' and 'cupool apply' accept: applying it to the same holder changes\n"
      "nothing. Devices are written as UUIDs, so the file means the same GPUs on another boot. A config's\n"
      "process: section is not in it (cupool exec applies that in each process; the holder holds nothing\n"
      "of it), and nor are tensor sets made by 'buffer load': comments at the top say so.\n"
      "--format json writes the same document as JSON (which check and apply read too).\n"
      "Anyone who can open the holder's socket may ask.\n"
      "\nExamples:\n"
      "  cupool export\n"
      "  cupool export --output /etc/cupool/cupool.yaml\n"
      "  cupool export | cupool check -\n"
      "  cupool export --format json | jq '.pools[].name'\n"
      "\nExit codes: 0 written, 2 the output file can't be written, 4 no holder is listening or it refused.");
  add_socket_option(sub, args->socket);
  sub->add_option("--output", args->output, "Write the config to this file ('-': standard output)")
      ->capture_default_str();
  sub->add_option("--format,-o", args->format, "Output format: yaml (a config file) or json (the same document)")
      ->check(CLI::IsMember({"yaml", "json"}))
      ->capture_default_str();

  return {sub, [args](Context&) {
            HolderClient holder = HolderClient::connect(args->socket, "cupool export");
            const nlohmann::ordered_json reply = holder.request(proto::to_json(proto::Export{}));
            model::ExportReply exported;
            try {
              exported = model::read_json_strict<model::ExportReply>(reply);
            } catch (const std::invalid_argument&) {
              throw Error(Errc::unreachable, "the holder at " + holder.socket() + " sent an export without \"config\"");
            }
            std::string text = exported.config;
            if (!text.empty() && text.back() != '\n') text += '\n';
            if (args->format == "json") text = as_json(text);
            if (args->output == "-") {
              std::cout << text << std::flush;
            } else {
              write_file_atomically(args->output, text);  // only once the holder answered: nothing truncated
              spdlog::info("wrote {} bytes to {}", text.size(), args->output);
            }
            return static_cast<int>(ExitCode::ok);
          }};
}

}  // namespace cupool::cli
