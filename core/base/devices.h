// Which numbering a device ordinal is in. The holder and each of its clients number the node's
// devices differently (CUDA_VISIBLE_DEVICES, a container's devices), so an ordinal from the wire
// must never reach a process's own driver calls unmapped: the two are different types, and the
// only way from one to the other is through the device's UUID (client/connection.cpp).
#pragma once

namespace cupool {

// A device as the holder numbers it: the CUDA ordinal in the holder's process, what the protocol's
// `device` fields carry (docs/protocol.md) and what `cupool_alloc` takes.
struct HolderDevice {
  int index = 0;
  constexpr explicit HolderDevice(int i = 0) : index(i) {}
  friend constexpr bool operator==(HolderDevice a, HolderDevice b) { return a.index == b.index; }
  friend constexpr bool operator!=(HolderDevice a, HolderDevice b) { return a.index != b.index; }
  friend constexpr bool operator<(HolderDevice a, HolderDevice b) { return a.index < b.index; }
};

// A device as this process numbers it: its CUDA ordinal here, what this process's backend takes,
// what `cupool_open_buffer_on` takes and `cupool_lease_device` returns.
struct ProcessDevice {
  int ordinal = 0;
  constexpr explicit ProcessDevice(int o = 0) : ordinal(o) {}
  friend constexpr bool operator==(ProcessDevice a, ProcessDevice b) { return a.ordinal == b.ordinal; }
  friend constexpr bool operator!=(ProcessDevice a, ProcessDevice b) { return a.ordinal != b.ordinal; }
};

}  // namespace cupool
