// cupool buffer create / load / ls / rm: named long-lived allocations in the running holder's pools
// (e.g. model weights that several processes share). `load` is in buffer_load.cpp.
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "base/units.h"
#include "cli/buffer_load.h"
#include "cli/holder_client.h"
#include "cli/holder_render.h"
#include "cli/options.h"
#include "cli/verbs.h"
#include "model/fields.h"
#include "protocol/messages.h"

namespace cupool::cli {

namespace {

using json = nlohmann::ordered_json;

struct BufferArgs {
  std::string socket = kDefaultSocket;
  std::string format = "table";
  std::string name;
  std::string pool;
  int device = -1;
  std::string size;
  bool force = false;
  std::vector<std::string> files;  // load
  std::vector<int> devices;        // load: none, or one per file
  std::string part_size;
  unsigned read_threads = 0;
  std::string direct_io = "auto";
  std::string gds = "auto";
  CLI::App* create = nullptr;
  CLI::App* load = nullptr;
  CLI::App* ls = nullptr;
  CLI::App* rm = nullptr;
};

// The config's naming rule: [a-z0-9][a-z0-9._-]*, at most 64 characters.
bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) return false;
  }
  return true;
}

void check_name(const std::string& name) {
  if (!valid_name(name))
    throw InputError("'" + name +
                     "' is not a buffer name: use lower-case letters, digits, '.', '_' and '-', starting with a "
                     "letter or digit, at most 64 characters");
}

// A buffer made where the holder has custody (the keeper, systemd's store) that custody could not
// take (the keeper stopped) is lost when the holder restarts: a warning on stderr says so and
// why, and the buffer is made all the same (exit 0). Without custody nothing outlives the holder,
// and status says that.
void warn_unless_kept(HolderClient& holder, const json& reply) {
  model::BufferMade made;
  model::Seen seen;
  model::read_json_lenient(reply, made, seen);
  if (!made.kept || *made.kept) return;  // kept, or a holder that does not say
  model::Status status;
  model::read_json_lenient(holder.request(proto::to_json(proto::Status{})), status, seen);
  const model::Custody& custody = status.custody;
  if (custody.kind.empty() || custody.kind == "none" || !custody.error) return;
  std::cerr << "cupool buffer create: warning: buffer " << made.name << " is not in custody (" << custody.error->message
            << "): it will not outlive a restart of the holder until custody has it "
            << "('cupool status' says when)\n";
}

int run_create(const BufferArgs& args) {
  const Format format = parse_format(args.format);
  check_name(args.name);
  std::string why;
  const auto size = parse_size(args.size, &why);
  if (!size) throw InputError("--size: '" + args.size + "' is not a size: " + why);
  if (*size == 0) throw InputError("--size: a buffer needs at least 1 byte");
  HolderClient holder = HolderClient::connect(args.socket, "cupool buffer create");
  proto::BufferCreate request;
  request.name = args.name;
  request.pool = args.pool;
  request.size_bytes = *size;
  if (args.device >= 0) {
    request.device = args.device;
  } else {
    // No --device: fine for a pool on one device; for a pool on several, guessing one would put
    // the buffer where its users may not look. (No such pool: the holder says so.)
    std::vector<int> devices;
    model::Status status;
    model::Seen seen;
    model::read_json_lenient(holder.request(proto::to_json(proto::Status{})), status, seen);
    for (const model::PoolStatus& p : status.pools)
      if (p.pool.name == args.pool && seen.has(p.pool.id.device)) devices.push_back(p.pool.id.device);
    if (devices.size() > 1) {
      std::string list;
      for (int d : devices) list += (list.empty() ? "" : ", ") + std::to_string(d);
      throw InputError("pool " + args.pool + " is on devices " + list + ": say which with --device");
    }
    if (devices.size() == 1) request.device = devices[0];
  }
  const json reply = holder.request(proto::to_json(request));
  print_reply(format, reply, render_buffer_created);
  warn_unless_kept(holder, reply);
  return static_cast<int>(ExitCode::ok);
}

int run_load(const BufferArgs& args) {
  const Format format = parse_format(args.format);
  check_name(args.name);
  std::uint64_t part_size = 0;
  if (!args.part_size.empty()) {
    std::string why;
    const auto parsed = parse_size(args.part_size, &why);
    if (!parsed) throw InputError("--part-size: '" + args.part_size + "' is not a size: " + why);
    if (*parsed < (1ULL << 20)) throw InputError("--part-size: a part is at least 1MiB");
    part_size = *parsed;
  }
  const LoadArgs base{args.socket,       args.name,      "",      args.pool, -1, part_size,
                      args.read_threads, args.direct_io, args.gds};
  if (args.files.size() == 1) {
    if (args.devices.size() > 1)
      throw InputError("--device: one file goes to one device, not " + std::to_string(args.devices.size()) +
                       " (several files go to one --device each, in order)");
    LoadArgs one = base;
    one.file = args.files.front();
    if (!args.devices.empty()) one.device = args.devices.front();
    const model::BufferMade loaded = load_buffer(one);
    print_reply(format, model::to_json(loaded), [&](const json&) { return render_loaded(loaded); });
    return static_cast<int>(ExitCode::ok);
  }
  // Several files: NAME-0, NAME-1, ..., every name checked before anything is read or made.
  const std::vector<LoadArgs> loads = split_load(base, args.files, args.devices, std::thread::hardware_concurrency());
  for (const LoadArgs& load : loads) check_name(load.name);
  const model::BuffersLoaded loaded = load_buffers(loads);
  print_reply(format, model::to_json(loaded), [&](const json&) { return render_loaded(loaded); });
  return static_cast<int>(ExitCode::ok);
}

// `cupool buffer ls NAME`: one buffer and the tensors it holds.
int run_ls_one(const BufferArgs& args, Format format) {
  HolderClient holder = HolderClient::connect(args.socket, "cupool buffer ls");
  const json reply = holder.request(proto::to_json(proto::BufferTensors{args.name}));
  print_reply(format, reply, render_buffer_tensors);
  return static_cast<int>(ExitCode::ok);
}

int run_ls(const BufferArgs& args) {
  const Format format = parse_format(args.format);
  if (!args.name.empty()) return run_ls_one(args, format);
  HolderClient holder = HolderClient::connect(args.socket, "cupool buffer ls");
  // `list` has each buffer as status does, and whether this user may open it.
  model::BufferListing listing;
  model::Seen seen;
  model::read_json_lenient(holder.request(proto::to_json(proto::List{})), listing, seen);
  if (!listing.buffers.is_array()) listing.buffers = json::array();
  print_reply(format, model::write_json(listing), [&](const json&) { return render_buffers(listing.buffers); });
  return static_cast<int>(ExitCode::ok);
}

int run_rm(const BufferArgs& args) {
  const Format format = parse_format(args.format);
  check_name(args.name);
  HolderClient holder = HolderClient::connect(args.socket, "cupool buffer rm");
  const json reply = holder.request_raw(proto::to_json(proto::BufferRemove{args.name, args.force}));
  if (const auto error = proto::error_of_reply(reply)) {
    if (error->code == "busy")
      throw Error::reported(
          "busy",
          error->message + " (--force removes it anyway: use it only when the processes that opened it are gone)");
    throw_reply_error(reply, "buffer_remove", "cupool buffer rm");
  }
  print_reply(format, reply, render_buffer_removed);
  return static_cast<int>(ExitCode::ok);
}

// `buffer load NAME FILE [FILE...]`: its options and help (run_load reads them).
void add_load(CLI::App* buffer, BufferArgs& args) {
  args.load = buffer->add_subcommand(
      "load", "Read a safetensors file into a new buffer and keep its tensor index (several files: one buffer each)");
  args.load->footer(
      "\n"
      "Checks the file's header first (a truncated file, a header too large, an unknown dtype, a shape\n"
      "that disagrees with its offsets, offsets past the end or overlapping are refused before anything\n"
      "is made). Then it creates the buffer, each tensor at a 256-byte aligned offset, and copies the data:\n"
      "several threads (one per core, 2 to 16) read chunks into pinned staging memory of their own (on\n"
      "huge pages where it can) while the chunks read before are copied to the GPU: 2 MiB chunks from\n"
      "the page cache, 64 MiB with O_DIRECT (when most of the file is not in the page cache), with\n"
      "a progress bar in GB/s on a terminal; the JSON says where the time went (stages). Where the node\n"
      "has GPUDirect Storage (the nvidia-fs module and NVIDIA's libcufile; `cupool query --deep` says),\n"
      "cuFile reads the chunks from storage straight into the GPU instead (--gds). The buffer is one\n"
      "allocation (in a device pool: an exported allocation, which outlives a restart of the holder);\n"
      "--part-size splits it into parts of at most that size, one allocation each (a tensor larger than\n"
      "that gets a part of its own), for host pools (their imports over 5 GiB crash on driver 580; exported\n"
      "allocations of 4 to 100 GiB were imported whole on an H200). Nobody can open the buffer until it\n"
      "is complete; if the load fails or this process is killed, the buffer is removed. Processes then\n"
      "map the weights with cupool.tensors(NAME) in Python, or cupool_open_buffer and the index from\n"
      "`cupool buffer ls NAME --format json`.\n"
      "\n"
      "Several files (one shard per GPU for a tensor-parallel engine) load at once, one buffer per file\n"
      "named NAME-0, NAME-1, ... in the files' order: file k goes to the k-th --device when --device is\n"
      "given once per file, else to device k. Every header is read and every name checked before any\n"
      "buffer is made; then each file is read by a thread of its own on its own connection, with one\n"
      "progress line for all, and the read threads are shared out: each load gets max(2, D / files)\n"
      "threads, D being one load's default (one per core, 2 to 16), unless --read-threads says how many\n"
      "each load gets. All or nothing: if one load fails, the others stop and every buffer the command\n"
      "made is removed, and the error names the file and device. The same file may be given twice.\n"
      "\nExamples:\n"
      "  sudo cupool buffer load llama /models/llama/model.safetensors --pool weights\n"
      "  sudo cupool buffer load llama model.safetensors --pool weights --device 1 --format json\n"
      "  sudo cupool buffer load llama tp0.safetensors tp1.safetensors --pool weights   # llama-0 on 0, llama-1 on 1\n"
      "  sudo cupool buffer load qwen a.safetensors b.safetensors --pool weights -d 2 -d 3\n"
      "  sudo cupool buffer load qwen model.safetensors --pool weights --read-threads 4 --direct-io never\n"
      "  sudo cupool buffer load qwen /nvme/qwen.safetensors --pool weights --gds always\n"
      "\nExit codes: 0 loaded, 1 the holder could not (it exists, no such pool or device, no room), 2 a bad\n"
      "file, bad arguments, or a --direct-io always or --gds always that cannot be had here, 4 no holder\n"
      "is listening or it refused (loading needs an admin).");
  args.load->add_option("name", args.name, "The buffer's name ([a-z0-9][a-z0-9._-]*, at most 64 characters)")
      ->required();
  args.load
      ->add_option("files", args.files,
                   "The safetensors file; several: one buffer each, NAME-0, NAME-1, ... in this order")
      ->required()
      ->check(CLI::ExistingFile);
  args.load->add_option("--pool", args.pool, "The pool to allocate it from (one with the posix_fd handle type)")
      ->required();
  args.load
      ->add_option("--device,-d", args.devices,
                   "The holder's CUDA ordinal of the pool's device (default: the pool's first); with several "
                   "files once per file, in order (default: file k to device k)")
      ->check(CLI::NonNegativeNumber)
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  args.load->add_option("--part-size", args.part_size,
                        "The largest allocation of the buffer, with a unit (default: one allocation; at least 1MiB)");
  args.load
      ->add_option("--read-threads", args.read_threads,
                   "Threads that read the file at once, each with two pinned staging slots of a chunk (2 MiB from "
                   "the page cache, 64 MiB with O_DIRECT; default: one per core, 2 to 16; with several files, per "
                   "file: default max(2, that / files))")
      ->check(CLI::Range(1u, 64u));
  args.load
      ->add_option("--direct-io", args.direct_io,
                   "Read with O_DIRECT: auto (when most of the file is not in the page cache), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->default_str("auto");
  args.load
      ->add_option("--gds", args.gds,
                   "Read through GPUDirect Storage (cuFile): auto (when nvidia-fs is loaded and cuFile takes the "
                   "file), always (exit 2 where it cannot), never")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->default_str("auto");
}

}  // namespace

Verb add_buffer(CLI::App& app) {
  auto args = std::make_shared<BufferArgs>();
  CLI::App* sub = app.add_subcommand("buffer", "Create, load, list and remove named buffers in the running holder");
  sub->require_subcommand(1);
  sub->footer(
      "\n"
      "Named buffers are long-lived allocations in the holder's pools that outlive the processes using\n"
      "them, e.g. model weights loaded once and opened by several servers (cupool_open_buffer in the C\n"
      "API, cupool.tensors in Python). Creating, loading and removing needs an admin (root or the holder's\n"
      "own user); listing does not. A buffer of a device pool outlives the holder when custody keeps it\n"
      "(see 'cupool hold --help'); any other goes with the holder.\n"
      "\nExamples:\n"
      "  sudo cupool buffer create embeddings --pool weights --device 0 --size 2GiB\n"
      "  sudo cupool buffer load llama model.safetensors --pool weights\n"
      "  cupool buffer ls\n"
      "  cupool buffer ls llama\n"
      "  sudo cupool buffer rm embeddings\n"
      "\nExit codes: 0 done, 1 the holder could not (no such pool or buffer, it exists, it is open, no\n"
      "room), 2 bad arguments, 4 no holder is listening or it refused.");

  args->create = sub->add_subcommand("create", "Allocate a named buffer in a held pool");
  args->create->footer(
      "\nExamples:\n"
      "  sudo cupool buffer create embeddings --pool weights --device 0 --size 2GiB\n"
      "  sudo cupool buffer create scratch --pool weights --size 1GiB     # a pool on one device\n"
      "\nExit codes: 0 created, 1 it exists / no such pool or device / no room, 2 bad arguments,\n"
      "4 no holder is listening or it refused (creating needs an admin).");
  args->create->add_option("name", args->name, "The buffer's name ([a-z0-9][a-z0-9._-]*, at most 64 characters)")
      ->required();
  args->create->add_option("--pool", args->pool, "The pool to allocate it from")->required();
  args->create
      ->add_option("--device,-d", args->device,
                   "The holder's CUDA ordinal of the pool's device (needed only when the pool is on several)")
      ->check(CLI::NonNegativeNumber);
  args->create->add_option("--size", args->size, "How many bytes, with a unit (e.g. 10GiB)")->required();

  add_load(sub, *args);

  args->ls = sub->add_subcommand("ls", "List the named buffers, or the tensors one holds");
  args->ls->alias("list");
  args->ls->footer(
      "\n"
      "Without a name: every buffer, who may open it, how often it is open, whether it is ready or still\n"
      "loading, and how many tensors it holds. With a name: that buffer's tensors (name, dtype, shape,\n"
      "part, offset in the part and size).\n"
      "\nExamples:\n"
      "  cupool buffer ls\n"
      "  cupool buffer ls --format json | jq -r '.buffers[] | select(.permitted) | .name'\n"
      "  cupool buffer ls llama\n"
      "  cupool buffer ls llama --format json | jq '.tensors[] | select(.dtype == \"BF16\") | .name'\n"
      "\nExit codes: 0 listed, 1 no such buffer, or it is still loading, 4 no holder is listening or it refused.");
  args->ls->add_option("name", args->name, "A buffer whose tensors to list");

  args->rm = sub->add_subcommand("rm", "Remove a named buffer and free its memory");
  args->rm->alias("remove");
  args->rm->footer(
      "\n"
      "A buffer that some process still has open is not removed unless --force; with --force the holder\n"
      "frees it without telling those processes, so use it only when they are gone.\n"
      "\nExamples:\n"
      "  sudo cupool buffer rm embeddings\n"
      "\nExit codes: 0 removed, 1 no such buffer / it is open, 2 bad arguments, 4 no holder is listening\n"
      "or it refused (removing needs an admin).");
  args->rm->add_option("name", args->name, "The buffer's name")->required();
  args->rm->add_flag("--force", args->force, "Remove it even if it is open somewhere");

  for (CLI::App* leaf : {args->create, args->load, args->ls, args->rm}) {
    add_socket_option(leaf, args->socket);
    add_format_option(leaf, args->format);
  }

  return {sub, [args](Context&) {
            if (args->create->parsed()) return run_create(*args);
            if (args->load->parsed()) return run_load(*args);
            if (args->rm->parsed()) return run_rm(*args);
            return run_ls(*args);
          }};
}

}  // namespace cupool::cli
