#include "base/devices.h"

#include <doctest/doctest.h>

#include <map>
#include <type_traits>

namespace cupool::devices_test {

// The point of the two types: an ordinal in one numbering can't be used as one in the other, or as
// a bare int, without saying so.
static_assert(!std::is_convertible_v<HolderDevice, ProcessDevice>);
static_assert(!std::is_convertible_v<ProcessDevice, HolderDevice>);
static_assert(!std::is_convertible_v<int, HolderDevice>);
static_assert(!std::is_convertible_v<int, ProcessDevice>);
static_assert(!std::is_convertible_v<HolderDevice, int>);
static_assert(!std::is_convertible_v<ProcessDevice, int>);

TEST_CASE("a holder's device and a process's device compare within their own numbering") {
  CHECK(HolderDevice{1} == HolderDevice{1});
  CHECK(HolderDevice{0} != HolderDevice{1});
  CHECK(ProcessDevice{2} == ProcessDevice{2});
  CHECK(ProcessDevice{2} != ProcessDevice{0});
  // Keys of the client's table of imported pools.
  std::map<HolderDevice, int> by_device{{HolderDevice{1}, 10}, {HolderDevice{0}, 20}};
  CHECK(by_device.begin()->first == HolderDevice{0});
  CHECK(by_device.at(HolderDevice{1}) == 10);
}

}  // namespace cupool::devices_test
