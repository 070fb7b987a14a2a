# KV-sparsity kernels (window scores, selection, kept-entry writes, eviction), the GPU sampler,
# their benchmark, and their comparison tests against the CPU backend. Included by
# CMakeLists.txt in this folder. block_select.cuh is a header shared by the two kernel files.
list(APPEND SIEVE_CUDA_SOURCES sparsity_kernels.cu sampling_kernels.cu sparsity_bench.cu)
list(APPEND SIEVE_CUDA_TESTS cuda_sparsity_test.cc)
