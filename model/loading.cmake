# Loading a model from disk: configs, safetensors (mmap, sharded), the Llama tensor layout, and
# how a config splits over tensor-parallel ranks.
sieve_library(sieve_model_loading
  SOURCES model_config.cc generation_config.cc safetensors.cc llama_checkpoint.cc tensor_parallel.cc
  DEPS sieve_core nlohmann_json::nlohmann_json)

sieve_test(model_loading_test
  SOURCES model_config_test.cc safetensors_test.cc llama_checkpoint_test.cc
  DEPS sieve_model_loading)
