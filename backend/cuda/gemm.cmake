# GEMMs: the planner that picks cuBLASLt's configuration or the skinny kernel per shape, the
# skinny kernel, their comparison test against a host product and their benchmark. Included by
# CMakeLists.txt in this folder.
list(APPEND SIEVE_CUDA_SOURCES fp8_gemm.cu fp8_gemm_bench.cc gemm.cc gemm_bench.cc skinny_gemm.cu)
list(APPEND SIEVE_CUDA_TESTS cuda_gemm_test.cc)
