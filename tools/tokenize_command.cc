// sieve tokenize: stdin text -> token ids as a JSON array on one line.
#include <iostream>
#include <iterator>
#include <sstream>

#include "core/logging.h"
#include "tokenizer/tokenizer_loader.h"
#include "tools/commands.h"

namespace sieve {

CommandRunner AddTokenizeCommand(CLI::App& app) {
  struct Flags {
    std::string tokenizer;
    bool no_bos = false;
  };
  auto flags = std::make_shared<Flags>();
  app.add_option("--tokenizer", flags->tokenizer,
                 "A model directory, a tokenizer.json or a tokenizer.model")
      ->required();
  app.add_flag("--no-bos", flags->no_bos, "Do not prepend the BOS token");
  return [flags]() {
    auto tokenizer = LoadTokenizer(flags->tokenizer);
    if (!tokenizer.ok()) {
      std::cerr << "error: " << tokenizer.status().message() << "\n";
      return 1;
    }
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    auto ids = (*tokenizer)->Encode(text, !flags->no_bos);
    if (!ids.ok()) {
      std::cerr << "error: " << ids.status().message() << "\n";
      return 1;
    }
    std::ostringstream out;
    out << "[";
    for (size_t index = 0; index < ids->size(); ++index)
      out << (index ? ", " : "") << (*ids)[index];
    out << "]\n";
    std::cout << out.str();
    return 0;
  };
}

}  // namespace sieve
