#include "tools/bench/sse_parser.h"

namespace sieve::bench {

void SseParser::Feed(std::string_view bytes, const EventHandler& on_event) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (skip_lf_) {
      skip_lf_ = false;
      if (bytes[pos] == '\n') {
        ++pos;
        continue;
      }
    }
    const size_t end = bytes.find_first_of("\r\n", pos);
    if (end == std::string_view::npos) {
      line_.append(bytes.substr(pos));
      return;
    }
    line_.append(bytes.substr(pos, end - pos));
    skip_lf_ = bytes[end] == '\r';
    pos = end + 1;
    ProcessLine(on_event);
  }
}

void SseParser::Finish(const EventHandler& on_event) {
  if (!line_.empty()) ProcessLine(on_event);
  if (has_data_) {
    // A blank line completes the pending event.
    ProcessLine(on_event);
  }
}

void SseParser::ProcessLine(const EventHandler& on_event) {
  std::string_view line = line_;
  if (first_line_) {
    first_line_ = false;
    if (line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
  }
  if (line.empty()) {
    if (has_data_) on_event(data_);
    data_.clear();
    has_data_ = false;
  } else if (line.front() != ':') {
    const size_t colon = line.find(':');
    const std::string_view field = line.substr(0, colon);
    std::string_view value;
    if (colon != std::string_view::npos) {
      value = line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    }
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_.append(value);
      has_data_ = true;
    }
  }
  line_.clear();
}

}  // namespace sieve::bench
