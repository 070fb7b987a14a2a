// SseParser: splits a `text/event-stream` body into events, whatever the byte boundaries of the
// pieces it is fed (a TCP read can end mid-line, mid-"\r\n" or mid-UTF-8 character).
//
// Follows the WHATWG event-stream rules the OpenAI-compatible servers use: lines end in "\r\n",
// "\n" or "\r"; "data:" lines (one leading space dropped) accumulate, joined by "\n"; a blank line
// dispatches the event; lines starting with ':' are comments (keep-alives); other fields ("event",
// "id", "retry") are ignored because no OpenAI-compatible stream gives them meaning.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace sieve::bench {

class SseParser {
 public:
  // Receives the data of one event (e.g. "{...}" or "[DONE]").
  using EventHandler = std::function<void(std::string_view data)>;

  // Consumes `bytes`, calling `on_event` for every event completed by them.
  void Feed(std::string_view bytes, const EventHandler& on_event);
  // The stream ended: an event left without its closing blank line is dispatched anyway, since
  // some servers close the connection right after the last "data:" line.
  void Finish(const EventHandler& on_event);

 private:
  void ProcessLine(const EventHandler& on_event);

  std::string line_;        // the line being read, without its terminator
  std::string data_;        // data lines of the event being read, joined by '\n'
  bool has_data_ = false;   // whether data_ holds a data line (it may be an empty one)
  bool skip_lf_ = false;    // the last byte was '\r': a '\n' right after it ends no new line
  bool first_line_ = true;  // a UTF-8 byte-order mark may open the stream
};

}  // namespace sieve::bench
