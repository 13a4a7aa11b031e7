// What a CUDA build of libtorch generates here (c10/cuda/CUDAMacros.h includes it);
// Debian's CPU libtorch ships c10/cuda's headers without it. Only
// //libs/model:torch_cuda_compile_check uses this copy.
#pragma once
#define C10_CUDA_BUILD_SHARED_LIBS
