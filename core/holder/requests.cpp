// The request table and the dispatch: each request of docs/protocol.md read, renamed from an old
// protocol's names, and handed to its handler (client_requests.cpp, buffer_requests.cpp,
// admin_requests.cpp), which borrows the units it needs.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/error.h"
#include "base/text.h"
#include "base/units.h"
#include "holder/holder.h"
#include "holder/names.h"
#include "protocol/messages.h"

namespace cupool {

// The request table: every operation of docs/protocol.md and the handler that serves it.
std::vector<Holder::Operation> Holder::operations() {
  // A row: the operation's name and the unit's member that serves it.
  auto row = [](const char* name, auto& unit, Reply (std::remove_reference_t<decltype(unit)>::*handler)(Request&)) {
    return Operation{name, [&unit, handler](Request& r) { return (unit.*handler)(r); }};
  };
  return {
      row("hello", client_requests_, &ClientRequests::hello),
      row("list", client_requests_, &ClientRequests::list),
      row("import_pool", client_requests_, &ClientRequests::import_pool),
      row("alloc", client_requests_, &ClientRequests::alloc),
      row("free", client_requests_, &ClientRequests::free),
      row("reuse", client_requests_, &ClientRequests::reuse),
      row("dropped", client_requests_, &ClientRequests::dropped),
      row("buffer_open", buffer_requests_, &BufferRequests::open),
      row("buffer_close", buffer_requests_, &BufferRequests::close),
      row("status", admin_requests_, &AdminRequests::status),
      row("stats", admin_requests_, &AdminRequests::stats),
      row("trim", admin_requests_, &AdminRequests::trim),
      row("plan", admin_requests_, &AdminRequests::plan),
      row("apply", admin_requests_, &AdminRequests::apply),
      row("export", admin_requests_, &AdminRequests::export_config),
      row("buffer_create", buffer_requests_, &BufferRequests::create),
      row("buffer_remove", buffer_requests_, &BufferRequests::remove),
      row("buffer_ready", buffer_requests_, &BufferRequests::ready),
      row("buffer_tensors", buffer_requests_, &BufferRequests::tensors),
      row("budget_grant", budget_requests_, &BudgetRequests::grant),
      row("budget_claim", budget_requests_, &BudgetRequests::claim),
      row("budget_usage", budget_requests_, &BudgetRequests::usage),
      row("ledger", budget_requests_, &BudgetRequests::ledger),
  };
}

Reply Holder::handle(std::uint64_t id, const Json& request) {
  return buffers_.then_sync_custody([&] { return serve(id, request); });
}

Reply Holder::serve(std::uint64_t id, const Json& request) {
  HeldClient& c = clients_.at(id);
  const proto::RequestHead head = proto::request_head(request);
  if (!head.op) throw Error(Errc::bad_request, "a request needs \"op\", a string");
  const std::string op = *head.op;
  // The connection holds such a request until the start is over (Conversation): never served here.
  if (starting_ && !serves_while_starting(op))
    throw Error(Errc::busy, "the holder is starting (the driver is coming up): \"" + valid_utf8(op) +
                                "\" is served once it is; send it again");
  // Every request is read in protocol 4's names; a connection of 1 to 3 sends the old ones.
  const bool old_names = c.greeted && c.protocol < proto::kNamedProtocol;
  Json renamed;
  if (old_names) {
    renamed = request;
    proto::to_new_names(proto::Message::request, op, renamed);
  } else if (c.greeted)  // an old name on protocol 4: say the new one (Args would only say "unknown")
    for (const auto& item : request.items())
      if (const char* now = proto::new_name(proto::Message::request, op, item.key()))
        throw Error(Errc::bad_request, "unknown argument \"" + item.key() + "\": protocol " +
                                           std::to_string(proto::kNamedProtocol) + " calls it \"" + now +
                                           "\" (docs/naming.md)");
  proto::Args a(old_names ? renamed : request);
  if (head.id.is_null() || head.id.get<std::int64_t>() >= (1LL << 53))
    throw Error(Errc::bad_request, "a request needs \"id\", an integer from 0 to 2^53-1");
  if (!c.greeted && op != "hello")
    throw Error(Errc::hello_required, "the first request on a connection must be \"hello\"");

  const std::vector<Operation>& table = operations_;
  const auto it = std::find_if(table.begin(), table.end(), [&](const Operation& o) { return op == o.name; });
  if (it == table.end()) {
    std::vector<std::string> names;
    for (const Operation& o : table) names.emplace_back(o.name);
    const std::string hint = did_you_mean(op, names);
    throw Error(Errc::unknown_op, "unknown operation \"" + valid_utf8(op) + "\"" +
                                      (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
  }
  // "quiet": no reply when it succeeds (docs/protocol.md, "Quiet requests"): for the requests a
  // client's cache sends on its own, so the warm path never waits for the holder.
  if (a.boolean("quiet", false) && op != "free" && op != "reuse" && op != "dropped")
    throw Error(Errc::bad_request, "\"quiet\" is for free, reuse and dropped only");
  Request r{id, head.id, c, a, op};
  Reply out;
  try {
    out = it->serve(r);
    if (out.waits) {
      leasing_.run_ready_waiters();
      return out;
    }
    a.finish();
  } catch (const Error& e) {
    // An argument named in a refusal is named as this connection sent it.
    if (old_names && e.code() == Errc::bad_request) throw Error(e.code(), proto::in_old_names(op, e.what()));
    throw;
  }
  // An answer to a drop notice may be what another request waited for.
  leasing_.run_ready_waiters();
  if (c.protocol < proto::kNamedProtocol) proto::to_old_names(proto::Message::reply, op, out.body);  // hello too
  return out;
}
}  // namespace cupool
