// cupool completion SHELL: print a completion script for bash, zsh or fish, or (SHELL 'man') the
// manual page cupool(1).
//
// The script is generated from the command-line definition itself: the root CLI::App is walked for
// every visible verb (nested ones too), its options and positionals, and the fixed choices of
// CLI::IsMember options, so the scripts cannot drift from the CLI. The copies committed under
// completions/ and docs/man/cupool.1 are compared with this output by the completions-drift test
// and rewritten by scripts/regen-completions.sh. Nothing here knows about any particular verb.
//
// The model is read in cli/completion/model.cpp, and each shell's script written by its own file
// (cli/completion/bash.cpp, zsh.cpp, fish.cpp), the man page by cli/completion/man.cpp; this file is
// only the verbs that print the command line's own documentation: completion, man and help.
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "cli/completion/model.h"
#include "cli/completion/writers.h"
#include "cli/suggest.h"
#include "cli/verbs.h"

namespace cupool::cli {

namespace {

CLI::App* root_of(CLI::App* app) {
  while (app->get_parent() != nullptr) app = app->get_parent();
  return app;
}

std::string man_page(CLI::App* any) {
  CLI::App* root = root_of(any);
  const std::string prog = root->get_name().empty() ? "cupool" : root->get_name();
  return completion::man_page(completion::read_cli(*root), prog, CUPOOL_VERSION);
}

// Whether an executable `name` is in $PATH.
bool in_path(const std::string& name) { return !resolve_command(name).empty(); }

}  // namespace

Verb add_completion(CLI::App& app) {
  auto shell = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("completion", "Print a shell completion script (bash, zsh or fish)");
  sub->description(
      "Print a completion script for SHELL on stdout: verbs, options and their fixed choices, file names\n"
      "where a file is expected. It is generated from this binary's own command line, so it always\n"
      "matches the installed version. Packages install these scripts already; this is for installs by\n"
      "hand and for trying one out in the current shell. 'man' prints the manual page cupool(1) instead.");
  sub->footer(
      "\nInstall:\n"
      "  bash  cupool completion bash > ~/.local/share/bash-completion/completions/cupool\n"
      "        (needs the bash-completion package; or put 'source <(cupool completion bash)' in ~/.bashrc)\n"
      "  zsh   mkdir -p ~/.zfunc && cupool completion zsh > ~/.zfunc/_cupool\n"
      "        and in ~/.zshrc, before compinit: fpath=(~/.zfunc $fpath); autoload -Uz compinit && compinit\n"
      "  fish  cupool completion fish > ~/.config/fish/completions/cupool.fish\n"
      "\nTry one in the current shell:\n"
      "  source <(cupool completion bash)\n"
      "  source <(cupool completion zsh)      # after compinit\n"
      "  cupool completion fish | source\n"
      "\nOpen a new shell after installing.\n"
      "\nRead the manual page (packages install it as cupool(1)):\n"
      "  cupool man\n"
      "\nExit codes: 0 printed, 2 an unknown SHELL.");
  sub->add_option("shell", *shell, "The shell: bash, zsh or fish; or man, for the manual page cupool(1)")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh", "fish", "man"}));

  return {sub, [shell, sub](Context&) {
            CLI::App* root = root_of(sub);
            const std::string prog = root->get_name().empty() ? "cupool" : root->get_name();
            const completion::Command model = completion::read_cli(*root);
            if (*shell == "bash")
              std::cout << completion::bash_script(model, prog);
            else if (*shell == "zsh")
              std::cout << completion::zsh_script(model, prog);
            else if (*shell == "fish")
              std::cout << completion::fish_script(model, prog);
            else
              std::cout << man_page(sub);
            return 0;
          }};
}

Verb add_man(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("man", "Show the manual page cupool(1)");
  sub->footer(
      "\n"
      "Show the manual page, every verb with its options and examples, generated from this binary's own\n"
      "command line. On a terminal it is shown through 'man -l -' (where man is installed); otherwise the\n"
      "page is printed as roff, to save or format: packages install it as cupool(1).\n"
      "\nExamples:\n"
      "  cupool man\n"
      "  cupool man > cupool.1 && man -l cupool.1\n"
      "\nExit codes: 0 shown or printed; man's own when it fails.");
  return {sub, [sub](Context&) {
            const std::string page = man_page(sub);
            if (::isatty(STDOUT_FILENO) != 1 || !in_path("man")) {
              std::cout << page << std::flush;
              return 0;
            }
            std::cout << std::flush;
            // man quitting before it read the whole page is not an error here.
            std::signal(SIGPIPE, SIG_IGN);
            FILE* pipe = ::popen("man -l -", "w");
            if (!pipe) throw Error(Errc::internal, std::string("can't run 'man -l -': ") + std::strerror(errno));
            std::fwrite(page.data(), 1, page.size(), pipe);
            const int status = ::pclose(pipe);
            return status == -1 ? 1 : WIFEXITED(status) ? WEXITSTATUS(status) : 1;
          }};
}

Verb add_help(CLI::App& app) {
  auto words = std::make_shared<std::vector<std::string>>();
  CLI::App* sub = app.add_subcommand("help", "Show the help of cupool or of a verb, as --help does");
  sub->footer(
      "\n"
      "Print what 'cupool --help' prints, or with VERB what 'cupool VERB --help' prints: the verb's options,\n"
      "examples and exit codes. A verb under another is named after it ('cupool help buffer create').\n"
      "\nExamples:\n"
      "  cupool help\n"
      "  cupool help check\n"
      "  cupool help buffer load\n"
      "\nExit codes: 0 printed, 2 no such verb.");
  sub->add_option("verb", *words, "The verb, and a verb under it ('buffer create'); none: cupool itself");
  return {sub, [words, sub](Context&) {
            CLI::App* target = root_of(sub);
            std::string name = target->get_name().empty() ? "cupool" : target->get_name();
            std::vector<std::string> known;
            for (const std::string& word : *words) {
              CLI::App* next = nullptr;
              std::vector<std::string> names;
              for (CLI::App* s : target->get_subcommands([](const CLI::App* c) { return !c->get_group().empty(); })) {
                if (s->check_name(word)) next = s;
                names.push_back(s->get_name());
              }
              if (!next) {
                const std::string near = nearest(word, names);
                const std::string hint = !near.empty()   ? " (did you mean \"" + near + "\"?)"
                                         : names.empty() ? ""
                                                         : " (the verbs are: " + verb_list(*target) + ")";
                throw InputError(
                    (known.empty() ? "unknown verb \"" + word + "\"" : "'" + name + "' has no verb \"" + word + "\"") +
                    hint);
              }
              target = next;
              known.push_back(word);
              name += " " + target->get_name();
            }
            std::cout << target->get_formatter()->make_help(target, name, CLI::AppFormatMode::Normal) << std::flush;
            return 0;
          }};
}

}  // namespace cupool::cli
