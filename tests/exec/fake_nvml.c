/* A stand-in for libnvidia-ml.so.1 in the exec test's budget checks, built as libnvidia-ml.so.1
 * beside the stand-in driver: the node of fake_cuda.c (2 devices of 16 GiB, the same UUIDs) as
 * NVML lists it, in the other order (NVML numbers devices by PCI bus, CUDA fastest first), each
 * with 3 GiB used by other processes. */
#include <stdio.h>
#include <string.h>

typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
  const char* uuid;
} Device;

static const unsigned long long kTotal = 16ull << 30, kUsed = 3ull << 30, kReserved = 512ull << 20;
static Device devices[2] = {{"GPU-8d1c6a3e-0c11-4e4e-9f1e-1c2d3e4f5a6c"}, {"GPU-e886b279-2f4c-84d2-1f32-11a9c23257b7"}};
static int initialised = 0;

int nvmlInit_v2(void) {
  initialised = 1;
  return 0;
}

int nvmlShutdown(void) {
  initialised = 0;
  return 0;
}

int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!initialised) return 1; /* NVML_ERROR_UNINITIALIZED */
  *count = 2;
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, Device** device) {
  if (!initialised) return 1;
  if (index >= 2 || !device) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *device = &devices[index];
  return 0;
}

int nvmlDeviceGetUUID(Device* device, char* uuid, unsigned int length) {
  if (!initialised) return 1;
  if (!device || !uuid || length < 41) return 2;
  snprintf(uuid, length, "%s", device->uuid);
  return 0;
}

int nvmlDeviceGetMemoryInfo(Device* device, nvmlMemory_t* memory) {
  if (!initialised) return 1;
  if (!device || !memory) return 2;
  memory->total = kTotal;
  memory->used = kUsed;
  memory->free = kTotal - kUsed;
  return 0;
}

int nvmlDeviceGetMemoryInfo_v2(Device* device, nvmlMemory_v2_t* memory) {
  if (!initialised) return 1;
  if (!device || !memory) return 2;
  memory->total = kTotal;
  memory->reserved = kReserved;
  memory->used = kUsed;
  memory->free = kTotal - kUsed - kReserved;
  return 0;
}
