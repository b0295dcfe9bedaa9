// What plan, apply and check print as text: each change of a plan, and a rejected config's
// findings (declared in holder_render.h, beside the holder's other replies).
#include <sstream>
#include <string>
#include <vector>

#include "base/output.h"
#include "base/text.h"
#include "base/units.h"
#include "cli/holder_render.h"
#include "cli/reply_view.h"
#include "config/diagnostics.h"
#include "model/fields.h"
#include "model/model.h"

namespace cupool {

using json = nlohmann::ordered_json;
using render::Read;
using render::Shown;

namespace {

// A change with a reason (`blocked`) is not made.
bool is_blocked(const model::PlanChange& c) { return c.blocked.has_value(); }

std::string render_change(const model::PlanChange& c, const Shown& shown) {
  std::string mark = "?";
  if (c.action == "create")
    mark = "+";
  else if (c.action == "update")
    mark = "~";
  else if (c.action == "replace")
    mark = "-/+";
  else if (c.action == "remove")
    mark = "-";

  // "holder" changes (e.g. its socket) have no name of their own.
  const bool named = shown.has(c.name) && c.name != c.object;
  std::string line = mark + " " + valid_utf8(c.object) + (named ? " " + valid_utf8(c.name) : "");
  if (c.id) line += " on device " + std::to_string(c.id->device);
  if (mark == "?") line += " (" + valid_utf8(c.action) + ")";
  if (c.field) {
    line += ": " + valid_utf8(*c.field);
    // In config syntax; "" is no value: for a max_size, the driver's default.
    const std::string absent = *c.field == "max_size" ? "default" : "none";
    const auto value = [&](const std::optional<std::string>& v) { return v && !v->empty() ? valid_utf8(*v) : absent; };
    if (c.from || c.to) line += " " + value(c.from) + " -> " + value(c.to);
  }
  if (is_blocked(c)) {
    // A blocked remove or replace leaves the object as it is: it is kept.
    line += (c.action == "remove" || c.action == "replace" ? " (kept: " : " (blocked: ") + valid_utf8(*c.blocked) + ")";
  }
  return line;
}

}  // namespace

std::string render_change(const json& change) {
  const Read<model::PlanChange> read(change);
  return render_change(read.value, read.shown);
}

std::size_t change_count(const json& reply) { return Read<model::PlanReply>(reply).value.changes.size(); }

std::size_t blocked_changes(const json& reply) {
  const Read<model::PlanReply> read(reply);
  return static_cast<std::size_t>(std::count_if(read.value.changes.begin(), read.value.changes.end(), is_blocked));
}

namespace {

// An apply lasts until the holder reads its own file again: said, so it is not undone silently.
std::string lasts_until_reload(const json& reply) {
  const Read<model::PlanReply> read(reply);
  const model::PlanReply& plan = read.value;
  if (!read.shown.has(plan.applied) || !plan.applied || !plan.config) return "";
  return "The holder's file is still " + valid_utf8(*plan.config) +
         ": a reload (SIGHUP) or a restart goes back to it; edit that file to keep this.\n";
}

}  // namespace

std::string render_plan(const json& reply) {
  const Read<model::PlanReply> read(reply);
  const model::PlanReply& plan = read.value;
  if (plan.changes.empty()) return "no changes\n" + lasts_until_reload(reply);
  const bool applied = read.shown.has(plan.applied) && plan.applied;

  std::ostringstream out;
  // Counted per action; for apply only what was made.
  const char* const actions[] = {"create", "update", "replace", "remove"};
  const char* const planned[] = {"to create", "to update", "to replace", "to remove"};
  const char* const made[] = {"created", "updated", "replaced", "removed"};
  std::size_t counts[4] = {0, 0, 0, 0};
  std::size_t other = 0, blocked = 0;
  for (const model::PlanChange& c : plan.changes) {
    out << render_change(c, read.shown) << "\n";
    blocked += is_blocked(c);
    if (applied && is_blocked(c)) continue;
    const auto known = std::find(std::begin(actions), std::end(actions), c.action);
    if (known == std::end(actions))
      ++other;
    else
      ++counts[known - std::begin(actions)];
  }
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < 4; ++i)
    if (counts[i] > 0) parts.push_back(std::to_string(counts[i]) + " " + (applied ? made[i] : planned[i]));
  if (other > 0) parts.push_back(std::to_string(other) + " other");
  out << "\n" << (applied ? "Applied: " : "Plan: ") << (parts.empty() ? "nothing" : join(parts, ", "));
  if (blocked > 0) out << "; " << blocked << " blocked (" << (applied ? "not made" : "will not be made") << ")";
  out << ".\n";
  out << lasts_until_reload(reply);
  return out.str();
}

std::string render_findings(const json& findings, const SourceFile& file) {
  std::string out;
  if (!findings.is_array()) return out;
  for (const auto& f : findings) {
    // Read as the one finding object (model::Finding); one the holder sent malformed is said so.
    model::Finding m;
    try {
      m = model::finding_from_json(f);
    } catch (const std::exception& e) {
      out += file.path() + ": a finding the holder sent could not be read (" + e.what() + ")\n";
      continue;
    }
    Diagnostic d;
    d.severity = m.severity == "warning" ? Severity::warning : m.severity == "note" ? Severity::note : Severity::error;
    d.code = valid_utf8(m.code);
    d.message = valid_utf8(m.message);
    d.loc.line = std::max(0, std::min(m.line, 1 << 30));
    d.loc.column = std::max(0, std::min(m.column, 1 << 30));
    if (m.fact) d.fact = valid_utf8(*m.fact);
    if (m.help) d.help = valid_utf8(*m.help);
    d.invalid_input = m.invalid_input;
    out += render_text(d, file) + "\n";
  }
  return out;
}

}  // namespace cupool
