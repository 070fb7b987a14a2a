# Loading a model from disk: configs, safetensors (mmap, sharded), the Llama tensor layout, and
# how a config splits over tensor-parallel ranks.
sieve_library(sieve_model_loading
  SOURCES model_config.cc checkpoint_quantization.cc fp8_checkpoint.cc generation_config.cc
          safetensors.cc llama_checkpoint.cc tensor_parallel.cc
  DEPS sieve_core nlohmann_json::nlohmann_json)

sieve_test(model_loading_test
  SOURCES model_config_test.cc safetensors_test.cc llama_checkpoint_test.cc
  DEPS sieve_model_loading)

# Published FP8 checkpoints loaded into the model on the CPU backend, and dummy FP8 weights made
# layer by layer (fixture: testdata/models/llama_fp8_compressed, scripts/make_fp8_checkpoint.py).
# Labelled gpu as well: GpuFp8CheckpointTest compares the GPU with the CPU twin.
sieve_test(fp8_checkpoint_test SOURCES fp8_checkpoint_test.cc DEPS sieve_model sieve_backend_cpu
           LABELS cpu gpu)
if(SIEVE_HAVE_CUDA AND SIEVE_BUILD_TESTS)
  target_link_libraries(fp8_checkpoint_test PRIVATE sieve_backend_cuda)
  target_compile_definitions(fp8_checkpoint_test PRIVATE SIEVE_HAVE_CUDA=1)
endif()
