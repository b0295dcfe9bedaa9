#include "cli/query_table.h"

#include <doctest/doctest.h>

#include "device/query.h"
#include "device/sim_backend.h"
#include "tests/unit/fixtures.h"

namespace cupool::query_table_test {

TEST_CASE("the table names a simulated node and shows the peer matrix") {
  NodeReport node = test::two_gpu_node();
  node.peer_access[0][1] = false;
  SimBackend sim(node);
  NodeReport r = build_report(sim);
  r.source.profile_path = "p.yaml";
  const std::string t = render_report_table(r);
  CHECK(t.find("Simulated node from p.yaml") == 0);
  CHECK(t.find("  GPU0  -     no\n") != std::string::npos);
  CHECK(t.find("  GPU1  yes   -\n") != std::string::npos);
}

}  // namespace cupool::query_table_test
