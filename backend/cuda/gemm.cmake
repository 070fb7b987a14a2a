# GEMMs: the planner that picks cuBLASLt's configuration per shape, its comparison test against a
# host product and its benchmark. Included by CMakeLists.txt in this folder.
list(APPEND SIEVE_CUDA_SOURCES gemm.cc gemm_bench.cc)
list(APPEND SIEVE_CUDA_TESTS cuda_gemm_test.cc)
