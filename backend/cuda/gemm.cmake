# GEMMs: the planner that picks cuBLASLt's configuration or the skinny kernel per shape, the
# skinny kernel, the gate_up GEMM with SiLU fused (sm_90a), their comparison tests and their
# benchmark. Included by CMakeLists.txt in this folder.
list(APPEND SIEVE_CUDA_SOURCES gemm.cc gemm_bench.cc skinny_gemm.cu epilogue_gemm_sm90.cu)
list(APPEND SIEVE_CUDA_TESTS cuda_gemm_test.cc)
