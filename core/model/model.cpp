#include "model/model.h"

#include <stdexcept>

#include "model/fields.h"

namespace cupool::model {

// The writers and readers come from the declarations in fields.h.

void put_identity(Json& out, const DeviceId& id) {
  io::Writer w(out);
  fields(w, id);
}

void put_identity(Json& out, const ProcessDeviceId& id) {
  io::Writer w(out);
  fields(w, id);
}

void put_threshold(Json& out, const ReleaseThreshold& t) {
  io::Writer w(out);
  fields(w, t);
}

void put_pool(Json& out, const PoolInfo& p) {
  io::Writer w(out);
  fields(w, p);
}

void put_leases(Json& out, const LeaseTotals& l) {
  io::Writer w(out);
  fields(w, l);
}

Json parts_to_json(const std::vector<std::uint64_t>& sizes) {
  Json parts = Json::array();
  for (std::size_t i = 0; i < sizes.size(); ++i) parts.push_back({{"part", i}, {"size_bytes", sizes[i]}});
  return parts;
}

std::vector<std::uint64_t> parts_from_json(const Json& parts) {
  if (!parts.is_array()) throw std::invalid_argument("not an array");
  std::vector<std::uint64_t> sizes;
  for (const Json& p : parts) {
    const auto it = p.is_object() ? p.find("size_bytes") : p.end();
    if (!p.is_object() || it == p.end() || !it->is_number_unsigned())
      throw std::invalid_argument("a part without a size_bytes");
    sizes.push_back(it->get<std::uint64_t>());
  }
  return sizes;
}

Json to_json(const Source& v) { return write_json(v); }
Json to_json(const ErrorInfo& v) { return write_json(v); }
Json to_json(const Usage& v) { return write_json(v); }
Json to_json(const Reuse& v) { return write_json(v); }
Json to_json(const Finding& v) { return write_json(v); }
Json to_json(const PoolStatus& v) { return write_json(v); }
Json to_json(const PoolListed& v) { return write_json(v); }
Json to_json(const BufferInfo& v) { return write_json(v); }
Json to_json(const ClientInfo& v) { return write_json(v); }
Json to_json(const AdoptedBuffer& v) { return write_json(v); }
Json to_json(const RefusedBuffer& v) { return write_json(v); }
Json to_json(const Adoption& v) { return write_json(v); }
Json to_json(const PoolStats& v) { return write_json(v); }
Json to_json(const DeviceGraph& v) { return write_json(v); }
Json to_json(const PoolTrim& v) { return write_json(v); }
Json to_json(const GraphTrim& v) { return write_json(v); }
Json to_json(const ProcessPool& v) { return write_json(v); }
Json to_json(const Custody& v) { return write_json(v); }
Json to_json(const HolderInfo& v) { return write_json(v); }
Json to_json(const Status& v) { return write_json(v); }
Json to_json(const Stats& v) { return write_json(v); }
Json to_json(const Ledger& v) { return write_json(v); }
Json to_json(const BudgetGrant& v) { return write_json(v); }
Json to_json(const Trim& v) { return write_json(v); }
Json to_json(const TensorEntry& v) { return write_json(v); }
Json to_json(const BufferTensors& v) { return write_json(v); }
Json to_json(const BufferMade& v) { return write_json(v); }
Json to_json(const BuffersLoaded& v) { return write_json(v); }
Json to_json(const ProcessDevice& v) { return write_json(v); }
Json to_json(const ProcessStats& v) { return write_json(v); }
Json to_json(const ShareValue& v) { return write_json(v); }
Json to_json(const ExportedConfig& v) { return write_json(v); }
Json to_json(const PlanChange& v) { return write_json(v); }
Json to_json(const BenchCase& v) { return write_json(v); }
Json to_json(const BenchComparison& v) { return write_json(v); }
Json to_json(const HandleProbe& v) { return write_json(v); }
Json to_json(const DeviceFacts& v) { return write_json(v); }
Json to_json(const GdsFacts& v) { return write_json(v); }
Json to_json(const DmemFacts& v) { return write_json(v); }
Json to_json(const NodeFacts& v) { return write_json(v); }
Json to_json(const QueryFailure& v) { return write_json(v); }
Json to_json(const CheckReport& v) { return write_json(v); }
Json to_json(const ListReply& v) { return write_json(v); }
Json to_json(const PlanReply& v) { return write_json(v); }
Json to_json(const KeeperList& v) { return write_json(v); }
Json to_json(const BenchReport& v) { return write_json(v); }

const char* change_word(ChangeAction a) {
  switch (a) {
    case ChangeAction::create: return "create";
    case ChangeAction::update: return "update";
    case ChangeAction::replace: return "replace";
    case ChangeAction::remove: return "remove";
  }
  return "?";
}

const char* change_word(ChangeObject o) {
  switch (o) {
    case ChangeObject::pool: return "pool";
    case ChangeObject::buffer: return "buffer";
    case ChangeObject::holder: return "holder";
  }
  return "?";
}

ErrorInfo error_from_json(const Json& j) { return read_json_strict<ErrorInfo>(j); }

Finding finding_from_json(const Json& j) { return read_json_strict<Finding>(j); }

}  // namespace cupool::model
