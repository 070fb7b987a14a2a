# GEMMs: the small-m kernel, the planner that picks it or cuBLASLt per shape, their comparison
# test against a host product and their benchmark. Included by CMakeLists.txt in this folder.
list(APPEND SIEVE_CUDA_SOURCES small_m_gemm.cu gemm.cc gemm_bench.cc)
list(APPEND SIEVE_CUDA_TESTS cuda_gemm_test.cc)
