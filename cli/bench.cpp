// cupool bench: what allocation costs on this node, against the obvious alternatives, in one run.
#include "device/bench.h"

#include <unistd.h>

#include <iostream>
#include <sstream>

#include "base/error.h"
#include "base/output.h"
#include "base/units.h"
#include "cli/options.h"
#include "cli/suggest.h"
#include "cli/verbs.h"
#include "config/config.h"
#include "config/resolve.h"
#include "device/query.h"

namespace cupool::cli {

std::string render_bench_table(const model::BenchReport& r) {
  std::ostringstream out;
  out << "cupool bench on device " << r.gpu.device << " (" << r.gpu_name << "), " << r.source.backend << "\n";
  if (r.note) out << "NOTE: " << *r.note << "\n";
  out << "release threshold under test: " << r.release_threshold.text() << (r.config ? " (from " + *r.config + ")" : "")
      << "; " << r.iteration_count << " iterations per case; seed " << r.seed << "\n\n";
  Table t({"CASE", "SIZE", "N", "MEDIAN us", "P99 us", "MIN us"});
  auto us = [](double seconds) {
    const double v = seconds * 1e6;
    char buf[32];
    std::snprintf(buf, sizeof buf, v < 10 ? "%.2f" : "%.1f", v);
    return std::string(buf);
  };
  for (const model::BenchCase& c : r.cases)
    t.add({c.description, format_bytes(c.size_bytes), std::to_string(c.iteration_count), us(c.median_seconds),
           us(c.p99_seconds), us(c.min_seconds)});
  out << t.str() << "\n";
  Table cmp({"SIZE", "COMPARISON (ratio of medians)", "RATIO"});
  for (const model::BenchComparison& c : r.comparisons) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1fx", c.ratio);
    cmp.add({format_bytes(c.size_bytes), c.description, buf});
  }
  out << cmp.str();
  return out.str();
}

namespace {

struct BenchArgs {
  std::string config;
  std::string profile;
  std::string format = "table";
  std::string device = "0";
  std::string sizes = "1MiB,64MiB";
  int iterations = 200;
  std::uint64_t seed = 1;
};

std::vector<std::uint64_t> parse_sizes(const std::string& text) {
  std::vector<std::uint64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::string why;
    auto size = parse_size(item, &why);
    if (!size || *size == 0)
      throw InputError("--sizes: '" + item + "' is not a size (" + (why.empty() ? "zero" : why) +
                       "); e.g. --sizes 1MiB,64MiB,1GiB");
    out.push_back(*size);
  }
  if (out.empty() || out.size() > 16) throw InputError("--sizes: give 1 to 16 sizes, e.g. --sizes 1MiB,64MiB");
  return out;
}

}  // namespace

Verb add_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub =
      app.add_subcommand("bench", "Measure what allocation costs on this node, against cudaMalloc and the defaults");
  sub->footer(
      "\n"
      "Runs, in one process on one device, for each size: cudaMalloc+cudaFree against\n"
      "cudaMallocAsync+cudaFreeAsync; an allocate/free/synchronize loop at release threshold 0 (the\n"
      "default) against the threshold under test (the threshold the CONFIG gives the pool applications\n"
      "allocate from: process.current_pool's, else process.default_pool's; else max); the same as a\n"
      "captured CUDA graph; and a trim. Reports median, p99 and min per case and\n"
      "the ratios of medians. The cases run in an order shuffled by --seed. Creates a context on the device.\n"
      "On a simulated node (--profile) it runs and says that its figures come from a model, not this machine.\n"
      "\nExamples:\n"
      "  cupool bench\n"
      "  cupool bench configs/single-gpu-inference.yaml --sizes 1MiB,64MiB,1GiB --iterations 500\n"
      "  cupool bench --format json | jq '.comparisons[]'\n"
      "\nExit codes: 0 measured, 2 bad arguments or config, 3 no driver or device.");
  sub->add_option("config", args->config,
                  "A config whose process.current_pool (else default_pool) release_threshold is put under test");
  add_profile_option(sub, args->profile, "Run on");
  add_format_option(sub, args->format);
  sub->add_option("--device,-d", args->device, "The device: an index, a GPU UUID or a PCI bus id")
      ->capture_default_str();
  sub->add_option("--sizes", args->sizes, "Comma-separated sizes with units")->capture_default_str();
  sub->add_option("--iterations,-n", args->iterations, "Iterations per case and size")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  sub->add_option("--seed", args->seed, "Seed of the order the cases run in")->capture_default_str();

  return {sub, [args](Context& ctx) {
            const Format format = parse_format(args->format);
            if (!args->config.empty()) require_config(args->config, "bench");
            BenchOptions o;
            o.sizes = parse_sizes(args->sizes);
            o.iterations = args->iterations;
            o.seed = args->seed;
            auto backend = ctx.make_backend(args->profile);
            const NodeReport node = build_report(*backend);
            std::string why;
            const auto selector = parse_device_selector(args->device, &why);
            if (!selector) throw InputError("--device: " + why);
            const auto device = resolve_device(node, *selector);
            if (!device)
              throw InputError("--device: no device '" + args->device + "' on this node (run 'cupool query')");
            o.device = *device;
            if (!args->config.empty()) {
              const SourceFile file = SourceFile::read(args->config, kMaxConfigBytes);
              Diagnostics diags;
              const Config config = parse_config(file, diags);
              if (diags.has_invalid_input()) {
                std::cerr << render_text(diags, file);
                throw InputError(file.path() + " is not a valid config");
              }
              o.config = file.path();
              // cudaMallocAsync allocates from the current pool: with current_pool, that is the one whose
              // threshold the application lives with.
              const At<Threshold>* t = nullptr;
              if (config.process && config.process->current_pool && config.process->current_pool->release_threshold.set)
                t = &config.process->current_pool->release_threshold;
              else if (config.process && config.process->default_pool &&
                       config.process->default_pool->release_threshold.set)
                t = &config.process->default_pool->release_threshold;
              if (t)
                o.threshold =
                    *resolve_settings(*t, std::nullopt, node.device(o.device)->info.total_memory).release_threshold;
            }
            if (::isatty(2))
              o.progress = [](const std::string& line) { std::cerr << "cupool bench: " << line << "\n"; };
            const auto report = run_bench(*backend, o);
            switch (format) {
              case Format::table: std::cout << render_bench_table(report); break;
              case Format::json: std::cout << dump_json(versioned(model::to_json(report))) << "\n"; break;
              case Format::yaml: std::cout << to_yaml(versioned(model::to_json(report))); break;
            }
            return 0;
          }};
}

}  // namespace cupool::cli
