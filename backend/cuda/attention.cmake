# Attention kernels (prefill and paged decode), their comparison test and their benchmark.
# Included by CMakeLists.txt in this folder; paths are relative to it.
list(APPEND SIEVE_CUDA_SOURCES prefill_attention.cu prefill_attention_sm90.cu decode_attention.cu
     attention_bench.cu)
list(APPEND SIEVE_CUDA_TESTS cuda_attention_test.cc)
