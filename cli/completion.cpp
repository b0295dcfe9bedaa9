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
// only the verb.
#include <iostream>
#include <memory>
#include <string>

#include "cli/completion/model.h"
#include "cli/completion/writers.h"
#include "cli/verbs.h"

namespace cupool::cli {

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
      "  cupool completion man | man -l -");
  sub->add_option("shell", *shell, "The shell: bash, zsh or fish; or man, for the manual page cupool(1)")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh", "fish", "man"}));

  return {sub, [shell, sub](Context&) {
            CLI::App* root = sub;
            while (root->get_parent() != nullptr) root = root->get_parent();
            const std::string prog = root->get_name().empty() ? "cupool" : root->get_name();
            const completion::Command model = completion::read_cli(*root);
            if (*shell == "bash")
              std::cout << completion::bash_script(model, prog);
            else if (*shell == "zsh")
              std::cout << completion::zsh_script(model, prog);
            else if (*shell == "fish")
              std::cout << completion::fish_script(model, prog);
            else
              std::cout << completion::man_page(model, prog, CUPOOL_VERSION);
            return 0;
          }};
}

}  // namespace cupool::cli
