// The device code the current GPU runs. A build holds device code for each architecture
// CMAKE_CUDA_ARCHITECTURES lists, and the driver loads the closest: machine code of the device's
// own family, else PTX compiled for it at load. Host code that picks a kernel by a hardware
// feature (thread-block clusters, programmatic dependent launch, wgmma) asks what was loaded, not
// only what the device is: a build for sm_80 alone runs on an H100 from compute_80 PTX, whose
// kernels hold no cluster code, and a build for plain sm_90 (CMAKE_CUDA_ARCHITECTURES=native on an
// H100) lacks sm_90a's wgmma.
#pragma once

namespace sieve::cuda {

// __CUDA_ARCH__ of the image loaded on the current device (800, 890, 900, ...), read once per
// device. The first call for a device copies from it synchronously, so it must not come while the
// calling thread captures a graph: CudaBackend asks at creation.
int LoadedImageArch();

// Whether that image was compiled for sm_90a (wgmma, register reallocation, tensor copies).
bool LoadedImageIsSm90a();

}  // namespace sieve::cuda
