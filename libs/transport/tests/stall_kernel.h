// Test helper: holds a CUDA stream with a kernel that spins until the host releases it
// (what NCCL work queued behind a dead peer looks like).
#ifndef RLFLEET_LIBS_TRANSPORT_TESTS_STALL_KERNEL_H_
#define RLFLEET_LIBS_TRANSPORT_TESTS_STALL_KERNEL_H_

#ifdef __cplusplus
extern "C" {
#endif

// Launches the stall on `stream` (a cudaStream_t). `flag` is host memory mapped into
// the device (cudaHostAlloc with cudaHostAllocMapped); the kernel returns once *flag
// is non-zero, or after about 60 s at the latest. Returns 0 on success.
int RlfleetLaunchStall(void* stream, volatile int* flag);

#ifdef __cplusplus
}
#endif

#endif  // RLFLEET_LIBS_TRANSPORT_TESTS_STALL_KERNEL_H_
