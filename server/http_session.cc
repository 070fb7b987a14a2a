#include "server/http_session.h"

#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include "core/logging.h"
#include "server/json_util.h"
#include "server/response_builder.h"
#include "server/tokenizer_endpoints.h"
#include "sparsity/kv_policy_json.h"

namespace sieve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// A client may take this long to send a request (or idle between keep-alive requests), and a
// write may stall this long, before the connection is dropped.
constexpr auto kReadTimeout = std::chrono::seconds(60);
constexpr auto kWriteTimeout = std::chrono::seconds(60);
// After refusing a body (413), how long unread request bytes are drained so the client gets to
// read the response instead of a connection reset.
constexpr auto kLingerTimeout = std::chrono::seconds(2);
constexpr size_t kHeaderLimit = 64 * 1024;
// Request bytes held unparsed at once: a header up to kHeaderLimit plus one read (Beast reads at
// most 64 KiB at a time). The parser moves body bytes out as they arrive, and --max-body-bytes
// counts only a chunked body's data, so this is what bounds the rest of a chunked body: a
// chunk-size line with its extensions, or the trailer section, must fit in it.
constexpr size_t kReadBufferLimit = kHeaderLimit + 64 * 1024;

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

// Beast frames a request body by Content-Length or by a Transfer-Encoding whose last coding is
// chunked, and decodes only chunked: another coding before it (gzip, chunked) reaches the JSON
// parser still encoded, and a Transfer-Encoding that does not end with chunked is taken to mean
// "no body", so the body's bytes would be read as the next request on the connection (request
// smuggling). RFC 9112: that is a 400 and the connection closes (6.3); a transfer coding the
// server does not implement is a 501 (6.1).
std::optional<ApiError> TransferEncodingError(const http::request_header<>& request) {
  const auto [first, last] = request.equal_range(http::field::transfer_encoding);
  if (first == last) return std::nullopt;
  std::vector<std::string> codings;  // in the order they were applied
  std::string listed;                // the field values as sent, for the message
  for (auto field = first; field != last; ++field) {
    const std::string value(field->value());
    listed += (listed.empty() ? "" : ", ") + value;
    for (size_t start = 0; start <= value.size();) {
      const size_t end = std::min(value.find(',', start), value.size());
      // A coding is a token, maybe with parameters (";name=value"); lists may hold empty items.
      std::string coding = value.substr(start, std::min(value.find(';', start), end) - start);
      start = end + 1;
      const size_t begin = coding.find_first_not_of(" \t");
      if (begin == std::string::npos) continue;
      coding = coding.substr(begin, coding.find_last_not_of(" \t") + 1 - begin);
      std::transform(coding.begin(), coding.end(), coding.begin(),
                     [](unsigned char byte) { return static_cast<char>(std::tolower(byte)); });
      codings.push_back(std::move(coding));
    }
  }
  if (codings.empty() || codings.back() != "chunked") {
    return MakeApiError(400, "Transfer-Encoding '" + listed +
                                 "' does not end with chunked, so the body's length is unknown: "
                                 "send the body chunked or with a Content-Length");
  }
  if (std::find(codings.begin(), codings.end() - 1, "chunked") != codings.end() - 1) {
    return MakeApiError(400, "Transfer-Encoding '" + listed + "' applies chunked twice");
  }
  if (codings.size() > 1) {
    return MakeApiError(501, "transfer coding '" + codings.front() +
                                 "' is not supported (Transfer-Encoding '" + listed +
                                 "'): send the body chunked without other codings, or with a "
                                 "Content-Length");
  }
  return std::nullopt;
}

}  // namespace

// One HTTP request's generation: its engine requests and what has been written of the response.
struct HttpSession::Generation {
  Generation(uint64_t serial_in, CompletionRequest request_in, const std::string& model,
             const Tokenizer* tokenizer)
      : serial(serial_in),
        request(std::move(request_in)),
        builder(request, model, tokenizer),
        num_requests(static_cast<size_t>(request.num_choices())),
        times(num_requests),
        arrival(Clock::now()) {}

  struct Times {
    std::optional<Clock::time_point> last_token;
  };

  uint64_t serial;
  CompletionRequest request;
  ResponseBuilder builder;
  size_t num_requests;
  std::vector<Times> times;  // [num_requests]
  Clock::time_point arrival;
  std::vector<AsyncEngine::Ticket> tickets;
  size_t num_added = 0;
  size_t num_finished = 0;
  std::optional<ApiError> error;  // a request was refused: the response is this error
  bool client_gone = false;
  bool watching = false;  // an async_wait for readability is pending
  bool writing = false;
  bool stream_started = false;
  bool end_queued = false;  // the usage chunk and [DONE] are in outbox or written
  bool last_chunk_written = false;
  std::string outbox;     // SSE bytes not yet handed to a write
  std::string in_flight;  // the bytes being written
  std::optional<http::response<http::empty_body>> stream_header;
  std::optional<http::response_serializer<http::empty_body>> serializer;
};

HttpSession::HttpSession(tcp::socket socket, ServerContext& context)
    : stream_(std::move(socket)), context_(context), buffer_(kReadBufferLimit) {}

HttpSession::~HttpSession() {
  // Only when the server stopped its I/O threads mid-request: nobody will read the rest.
  if (generation_) {
    for (const AsyncEngine::Ticket ticket : generation_->tickets) context_.engine.Abort(ticket);
    context_.active_generations.fetch_sub(1);
  }
}

void HttpSession::Start() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->ReadHeader(); });
}

void HttpSession::ReadHeader() {
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(static_cast<uint64_t>(context_.options.max_body_bytes));
  stream_.expires_after(kReadTimeout);
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code error, size_t) { self->OnReadHeader(error); });
}

void HttpSession::OnReadHeader(beast::error_code error) {
  endpoint_ = "other";
  if (error) return OnReadError(error);
  const Request& request = parser_->get();
  keep_alive_ = request.keep_alive();
  if (const std::optional<ApiError> refused = TransferEncodingError(request)) {
    // Where this body ends cannot be known, so the connection cannot carry another request.
    return SendError(*refused, /*close=*/true, /*linger=*/true);
  }
  const boost::optional<uint64_t> length = parser_->content_length();
  if (length && *length > static_cast<uint64_t>(context_.options.max_body_bytes)) {
    return SendError(MakeApiError(413, "the request body of " + std::to_string(*length) +
                                           " bytes is larger than the limit of " +
                                           std::to_string(context_.options.max_body_bytes) +
                                           " (--max-body-bytes)"),
                     /*close=*/true, /*linger=*/true);
  }
  if (parser_->is_done()) return Dispatch();
  const auto expect = request.find(http::field::expect);
  if (expect != request.end() && beast::iequals(expect->value(), "100-continue")) {
    continue_.emplace(http::status::continue_, request.version());
    stream_.expires_after(kWriteTimeout);
    http::async_write(stream_, *continue_,
                      [self = shared_from_this()](beast::error_code write_error, size_t) {
                        if (write_error) return self->Close();
                        self->ReadBody();
                      });
    return;
  }
  ReadBody();
}

void HttpSession::ReadBody() {
  stream_.expires_after(kReadTimeout);
  http::async_read(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code error, size_t) { self->OnReadBody(error); });
}

void HttpSession::OnReadBody(beast::error_code error) {
  if (error) return OnReadError(error);
  Dispatch();
}

void HttpSession::OnReadError(beast::error_code error) {
  keep_alive_ = false;
  if (error == http::error::body_limit) {
    return SendError(MakeApiError(413, "the request body is larger than the limit of " +
                                           std::to_string(context_.options.max_body_bytes) +
                                           " bytes (--max-body-bytes)"),
                     /*close=*/true, /*linger=*/true);
  }
  // The read buffer filled up: only a chunked body's chunk-size line or trailer section can do
  // that (a header hits kHeaderLimit first).
  if (error == http::error::buffer_overflow) {
    return SendError(MakeApiError(413,
                                  "a chunk-size line (with its extensions) or the trailer "
                                  "section of the chunked request body is longer than " +
                                      std::to_string(kReadBufferLimit) + " bytes"),
                     /*close=*/true, /*linger=*/true);
  }
  // Beast refuses a header with both Content-Length and Transfer-Encoding (the shape of request
  // smuggling; RFC 9112 6.3 lets a server refuse it), naming whichever field came second. The
  // first is in the header parsed so far.
  const Request& partial = parser_->get();
  if ((error == http::error::bad_content_length &&
       partial.count(http::field::transfer_encoding) > 0) ||
      (error == http::error::bad_transfer_encoding &&
       partial.count(http::field::content_length) > 0)) {
    return SendError(MakeApiError(400,
                                  "the request has both Content-Length and "
                                  "Transfer-Encoding: send one of them"),
                     /*close=*/true, /*linger=*/true);
  }
  // Beast's HTTP errors are malformed requests; anything else (end of stream, timeout, reset)
  // means the client is gone or idle.
  const bool malformed =
      error.category() == http::make_error_code(http::error::bad_target).category() &&
      error != http::error::end_of_stream && error != http::error::partial_message;
  if (!malformed) return Close();
  SendError(MakeApiError(400, "malformed HTTP request: " + error.message()), /*close=*/true);
}

void HttpSession::Dispatch() {
  // Exceptions must not reach the I/O thread's run loop (Beast and JSON throw on some misuse).
  try {
    Route(parser_->get());
  } catch (const std::exception& exception) {
    spdlog::error("internal error serving a request: {}", exception.what());
    if (generation_) return OnClientGone();
    SendError(MakeApiError(500, std::string("internal error: ") + exception.what()),
              /*close=*/true);
  }
}

bool HttpSession::Authorized(const Request& request) const {
  const std::string& key = context_.options.api_key;
  if (key.empty()) return true;
  const auto header = request.find(http::field::authorization);
  if (header == request.end()) return false;
  const std::string expected = "Bearer " + key;
  const beast::string_view given = header->value();
  // Compare every byte whatever the first mismatch, so timing does not reveal the key.
  unsigned difference = given.size() == expected.size() ? 0u : 1u;
  for (size_t index = 0; index < given.size(); ++index) {
    difference |= static_cast<unsigned>(given[index] ^ expected[index % expected.size()]);
  }
  return difference == 0;
}

void HttpSession::Route(const Request& request) {
  std::string path(request.target());
  if (const size_t query = path.find('?'); query != std::string::npos) path.resize(query);
  const http::verb method = request.method();
  struct RouteEntry {
    const char* path;
    http::verb method;
  };
  static constexpr RouteEntry kRoutes[] = {
      {"/health", http::verb::get},
      {"/metrics", http::verb::get},
      {"/version", http::verb::get},
      {"/v1/models", http::verb::get},
      {"/server_info", http::verb::get},
      {"/v1/completions", http::verb::post},
      {"/v1/chat/completions", http::verb::post},
      {"/tokenize", http::verb::post},
      {"/detokenize", http::verb::post},
      {"/tokenizer_info", http::verb::get},
  };
  const RouteEntry* route = nullptr;
  for (const RouteEntry& candidate : kRoutes) {
    if (path == candidate.path) route = &candidate;
  }
  if (route == nullptr) {
    return SendError(MakeApiError(
        404, "no route " + std::string(request.method_string()) + " " + path, "", "not_found"));
  }
  endpoint_ = route->path;
  if (method != route->method) {
    return SendError(MakeApiError(405, "method " + std::string(request.method_string()) +
                                           " is not allowed on " + path + " (use " +
                                           std::string(http::to_string(route->method)) + ")"));
  }
  if (path == "/health") {
    if (context_.shutting_down.load()) {
      return SendError(MakeApiError(503, "the server is shutting down"));
    }
    if (!context_.engine.ready()) {
      // Requests sent now are queued and run once the warm-up ends.
      return SendError(MakeApiError(503, "the server is warming up (decode graphs, GEMM plans)"));
    }
    return SendResponse(200, "text/plain", "");  // vLLM's: 200 and no body
  }
  if (path == "/metrics") {
    return SendResponse(200, "text/plain; version=0.0.4; charset=utf-8",
                        context_.metrics.Render(context_.engine.Stats(),
                                                ServerMetrics::CacheConfigOf(context_.engine)));
  }
  if (path == "/version") {
    return SendResponse(200, "application/json", R"({"version":"0.1.0"})");
  }
  // vLLM's tokenizer endpoints, outside /v1 and, as vLLM's, not behind the API key.
  if (path == "/tokenize" || path == "/detokenize" || path == "/tokenizer_info") {
    return HandleTokenizer(request, path);
  }
  if (!Authorized(request)) {
    return SendError(MakeApiError(401,
                                  "missing or incorrect API key: send the header "
                                  "'Authorization: Bearer <key>'",
                                  "", "invalid_api_key"));
  }
  if (context_.shutting_down.load()) {
    return SendError(MakeApiError(503, "the server is shutting down"), /*close=*/true);
  }
  if (path == "/v1/models") {
    nlohmann::json data = nlohmann::json::array();
    for (const std::string& name : context_.options.served_model_names) {
      // vLLM's fields: parent null (no LoRA adapters) and one permission entry.
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", context_.created},
                      {"owned_by", "sieve"},
                      {"root", context_.model_name()},
                      {"parent", nullptr},
                      {"max_model_len", context_.engine.max_model_len()},
                      {"permission", nlohmann::json::array({{{"id", "modelperm-" + name},
                                                             {"object", "model_permission"},
                                                             {"created", context_.created},
                                                             {"allow_create_engine", false},
                                                             {"allow_sampling", true},
                                                             {"allow_logprobs", true},
                                                             {"allow_search_indices", false},
                                                             {"allow_view", true},
                                                             {"allow_fine_tuning", false},
                                                             {"organization", "*"},
                                                             {"group", nullptr},
                                                             {"is_blocking", false}}})}});
    }
    return SendResponse(200, "application/json",
                        DumpJson({{"object", "list"}, {"data", std::move(data)}}));
  }
  if (path == "/server_info") {
    // The engine's configuration, as vLLM's /server_info gives its own: benchmarks store it
    // beside their numbers, and `sieve bench` takes its bound's KV policy, pool and precision
    // (quantization: the weights as loaded, an FP8 checkpoint's included) from it.
    const AsyncEngine& engine = context_.engine;
    const EngineOptions& options = engine.engine_options();
    return SendResponse(
        200, "application/json",
        DumpJson({{"model", context_.model_name()},
                  {"max_model_len", engine.max_model_len()},
                  {"max_num_seqs", options.max_num_seqs},
                  {"max_num_batched_tokens", options.max_num_batched_tokens},
                  {"enable_chunked_prefill", options.enable_chunked_prefill},
                  {"enable_prefix_caching", options.enable_prefix_caching},
                  {"kv_policy", engine.kv_policy_spec()},
                  {"kv_policy_options", KvPolicyOptionsToJson(options.kv_policy_options)},
                  {"kv_policy_description", engine.kv_policy_description()},
                  {"page_size", options.page_size},
                  {"kv_cache_pages", engine.num_kv_pages()},
                  {"kv_cache_bytes", engine.kv_pool_bytes()},
                  {"kv_cache_dtype", options.kv_cache_dtype},
                  {"quantization", WeightQuantizationName(engine.weight_quantization())},
                  {"tensor_parallel_size", engine.tensor_parallel_size()},
                  {"enforce_eager", !options.cuda_graphs},
                  {"overlap_steps", options.overlap_steps},
                  {"batch_invariant", options.batch_invariant}}));
  }
  HandleCompletion(request, path == "/v1/completions" ? ApiKind::kCompletion : ApiKind::kChat);
}

void HttpSession::HandleTokenizer(const Request& request, const std::string& path) {
  std::string param;
  Result<nlohmann::json> response = InternalError("unreachable");
  if (path == "/tokenizer_info") {
    response = TokenizerInfoResponse(context_.limits);
  } else {
    nlohmann::json body;
    try {
      body = nlohmann::json::parse(request.body());
    } catch (const nlohmann::json::parse_error& error) {
      return SendError(
          MakeApiError(400, std::string("the body is not valid JSON: ") + error.what()));
    }
    if (body.is_object() && body.contains("model") && body["model"].is_string() &&
        !context_.IsServedModel(body["model"].get<std::string>())) {
      return SendError(
          MakeApiError(404, "The model '" + body["model"].get<std::string>() + "' does not exist.",
                       "model", "model_not_found"));
    }
    response = path == "/tokenize" ? TokenizeResponse(body, context_.limits, &param)
                                   : DetokenizeResponse(body, context_.limits, &param);
  }
  if (!response.ok()) return SendError(ApiErrorFromStatus(response.status(), param));
  SendResponse(200, "application/json", DumpJson(*response));
}

void HttpSession::HandleCompletion(const Request& request, ApiKind kind) {
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(request.body());
  } catch (const nlohmann::json::parse_error& error) {
    return SendError(MakeApiError(400, std::string("the body is not valid JSON: ") + error.what()));
  }
  std::string param;
  Result<CompletionRequest> parsed = ParseCompletionRequest(body, kind, context_.limits, &param);
  if (!parsed.ok()) return SendError(ApiErrorFromStatus(parsed.status(), param));
  if (!parsed->model.empty() && !context_.IsServedModel(parsed->model)) {
    return SendError(MakeApiError(404, "The model '" + parsed->model + "' does not exist.", "model",
                                  "model_not_found"));
  }
  StartGeneration(std::move(parsed).value());
}

void HttpSession::StartGeneration(CompletionRequest request) {
  const uint64_t serial = ++next_serial_;
  auto generation = std::make_unique<Generation>(serial, std::move(request), context_.model_name(),
                                                 context_.limits.tokenizer);
  std::vector<sieve::Request> requests =
      EngineRequests(generation->request, context_.engine.max_model_len());
  // Runs on the engine thread: stamp the time, hop to this connection's strand, never block.
  RequestSink sink = [self = shared_from_this(), serial](RequestEvent event) {
    const Clock::time_point when = Clock::now();
    net::post(self->stream_.get_executor(),
              [self, serial, event = std::move(event), when]() mutable {
                self->OnEvent(serial, std::move(event), when);
              });
  };
  Result<std::vector<AsyncEngine::Ticket>> tickets =
      context_.engine.Submit(std::move(requests), std::move(sink));
  if (!tickets.ok()) return SendError(ApiErrorFromStatus(tickets.status()));
  generation->tickets = std::move(tickets).value();
  generation_ = std::move(generation);
  context_.active_generations.fetch_add(1);
  // No timeout while the engine works: a long generation is not a stalled client.
  stream_.expires_never();
  WatchDisconnect();
}

void HttpSession::OnEvent(uint64_t serial, RequestEvent event, Clock::time_point when) {
  Generation* generation = generation_.get();
  if (generation == nullptr || generation->serial != serial) return;  // a finished generation's
  try {
    switch (event.kind) {
      case RequestEvent::Kind::kAdded:
        ++generation->num_added;
        if (generation->num_added == generation->num_requests && generation->request.stream &&
            !generation->client_gone) {
          StartStream();
        }
        return;
      case RequestEvent::Kind::kRejected:
        ++generation->num_finished;
        if (!generation->error) {
          generation->error = ApiErrorFromStatus(event.status);
          // The other choices cannot be answered without this one.
          for (const AsyncEngine::Ticket ticket : generation->tickets) {
            context_.engine.Abort(ticket);
          }
        }
        return MaybeFinish();
      case RequestEvent::Kind::kOutput:
        break;
    }
    const RequestOutput& output = event.output;
    RecordTimes(*generation, event.index, output, when);
    if (output.finished) ++generation->num_finished;
    if (generation->client_gone || generation->error) return MaybeFinish();
    if (generation->request.stream) {
      generation->outbox += generation->builder.Event(event.index, output);
      return Pump();
    }
    generation->builder.Add(event.index, output);
    MaybeFinish();
  } catch (const std::exception& exception) {
    spdlog::error("internal error while streaming a response: {}", exception.what());
    OnClientGone();
  }
}

void HttpSession::RecordTimes(Generation& generation, size_t index, const RequestOutput& output,
                              Clock::time_point when) {
  Generation::Times& times = generation.times.at(index);
  ServerMetrics& metrics = context_.metrics;
  for (size_t token = 0; token < output.new_tokens.size(); ++token) {
    if (!times.last_token) {
      metrics.ObserveTimeToFirstToken(Seconds(when - generation.arrival));
    } else {
      metrics.ObserveInterTokenLatency(Seconds(when - *times.last_token));
    }
    times.last_token = when;
  }
  if (output.finished) {
    metrics.ObserveRequestFinished(output.finish_reason, Seconds(when - generation.arrival),
                                   output.num_prompt_tokens, output.num_generated_tokens);
  }
}

void HttpSession::StartStream() {
  Generation& generation = *generation_;
  generation.stream_started = true;
  auto& header = generation.stream_header.emplace(http::status::ok, parser_->get().version());
  header.set(http::field::server, "sieve");
  header.set(http::field::content_type, "text/event-stream");
  header.set(http::field::cache_control, "no-cache");
  header.keep_alive(keep_alive_ && !context_.shutting_down.load());
  header.chunked(true);
  generation.serializer.emplace(header);
  generation.outbox = generation.builder.Start() + generation.outbox;
  context_.metrics.CountHttpResponse(endpoint_, 200);
  generation.writing = true;
  stream_.expires_after(kWriteTimeout);
  http::async_write_header(
      stream_, *generation.serializer,
      [self = shared_from_this(), serial = generation.serial](beast::error_code error, size_t) {
        self->OnStreamWrite(serial, error);
      });
}

void HttpSession::Pump() {
  Generation& generation = *generation_;
  if (!generation.stream_started || generation.writing || generation.client_gone) return;
  if (generation.outbox.empty()) {
    if (generation.num_finished < generation.num_requests) return;
    if (!generation.end_queued) {
      generation.end_queued = true;
      generation.outbox = generation.builder.End();
    } else if (!generation.last_chunk_written) {
      generation.last_chunk_written = true;
      generation.writing = true;
      stream_.expires_after(kWriteTimeout);
      net::async_write(
          stream_, http::make_chunk_last(),
          [self = shared_from_this(), serial = generation.serial](beast::error_code error, size_t) {
            self->OnStreamWrite(serial, error);
          });
      return;
    } else {
      return MaybeFinish();
    }
  }
  generation.in_flight = std::move(generation.outbox);
  generation.outbox.clear();
  generation.writing = true;
  stream_.expires_after(kWriteTimeout);
  net::async_write(stream_, http::make_chunk(net::buffer(generation.in_flight)),
                   [self = shared_from_this(), serial = generation.serial](
                       beast::error_code error, size_t) { self->OnStreamWrite(serial, error); });
}

void HttpSession::OnStreamWrite(uint64_t serial, beast::error_code error) {
  Generation* generation = generation_.get();
  if (generation == nullptr || generation->serial != serial) return;
  generation->writing = false;
  if (error) return OnClientGone();
  stream_.expires_never();
  Pump();
}

void HttpSession::MaybeFinish() {
  Generation& generation = *generation_;
  if (generation.num_finished < generation.num_requests) return;
  if (generation.client_gone) return EndGeneration();
  if (generation.error) {
    const ApiError error = *generation.error;
    EndGeneration();
    return SendError(error);
  }
  if (!generation.request.stream) {
    std::string body = generation.builder.Body();
    EndGeneration();
    return SendResponse(200, "application/json", std::move(body));
  }
  if (!generation.last_chunk_written || generation.writing) return Pump();
  const bool close = !keep_alive_ || context_.shutting_down.load();
  EndGeneration();
  if (close) return Close();
  ReadHeader();
}

void HttpSession::WatchDisconnect() {
  Generation& generation = *generation_;
  generation.watching = true;
  stream_.socket().async_wait(tcp::socket::wait_read,
                              [self = shared_from_this(), serial = generation.serial](
                                  beast::error_code error) { self->OnReadable(serial, error); });
}

void HttpSession::OnReadable(uint64_t serial, beast::error_code error) {
  Generation* generation = generation_.get();
  if (generation == nullptr || generation->serial != serial) return;
  generation->watching = false;
  if (error == net::error::operation_aborted || generation->client_gone) return;
  if (!error) {
    // Readable means data (a pipelined request: leave it for the next read) or end of stream,
    // or nothing at all: readiness can be stale (the request's own bytes, read speculatively
    // before the watch began). So peek without blocking, and watch again when there is nothing.
    char byte = 0;
    const ssize_t peeked =
        ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (peeked > 0) return;
    if (peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      return WatchDisconnect();
    }
  }
  spdlog::debug("client left mid-request: aborting {} engine request(s)",
                generation->tickets.size());
  OnClientGone();
}

void HttpSession::OnClientGone() {
  if (!generation_) return Close();
  Generation& generation = *generation_;
  generation.client_gone = true;
  // Abort first: the pages are freed on the engine thread's next turn, not at the next write.
  for (const AsyncEngine::Ticket ticket : generation.tickets) context_.engine.Abort(ticket);
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
  MaybeFinish();
}

void HttpSession::EndGeneration() {
  if (generation_->watching && stream_.socket().is_open()) {
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
  }
  generation_.reset();
  context_.active_generations.fetch_sub(1);
}

void HttpSession::SendResponse(int status, std::string content_type, std::string body, bool close,
                               bool linger) {
  if (context_.shutting_down.load()) close = true;
  // A request too malformed to have a version still gets an HTTP/1.1 answer.
  const unsigned version =
      parser_ && parser_->get().version() >= 10 ? parser_->get().version() : 11;
  auto& response = response_.emplace(static_cast<http::status>(status), version);
  response.set(http::field::server, "sieve");
  response.set(http::field::content_type, content_type);
  if (status == 405) {
    const bool post =
        endpoint_.rfind("/v1/c", 0) == 0 || endpoint_ == "/tokenize" || endpoint_ == "/detokenize";
    response.set(http::field::allow, post ? "POST" : "GET");
  }
  response.keep_alive(keep_alive_ && !close);
  response.body() = std::move(body);
  response.prepare_payload();
  context_.metrics.CountHttpResponse(endpoint_, status);
  stream_.expires_after(kWriteTimeout);
  http::async_write(
      stream_, response,
      [self = shared_from_this(), close = close || !keep_alive_, linger](
          beast::error_code error, size_t) { self->OnResponseWritten(close, linger, error); });
}

void HttpSession::SendError(const ApiError& error, bool close, bool linger) {
  // /health's 503 is the state it reports (warming up, shutting down), asked for every second
  // or so by whatever waits on the server: not a failure worth a warning each time.
  if (error.http_status >= 500 && endpoint_ != "/health") {
    spdlog::warn("{} {}: {}", error.http_status, endpoint_, error.message);
  } else {
    spdlog::debug("{} {}: {}", error.http_status, endpoint_, error.message);
  }
  SendResponse(error.http_status, "application/json", ApiErrorBody(error), close, linger);
}

void HttpSession::OnResponseWritten(bool close, bool linger, beast::error_code error) {
  if (error) return Close();
  if (linger) return Linger();
  if (close) return Close();
  ReadHeader();
}

void HttpSession::Linger() {
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream_.expires_after(kLingerTimeout);  // for all the reads below together
  DiscardInput();
}

void HttpSession::DiscardInput() {
  stream_.async_read_some(net::buffer(discard_),
                          [self = shared_from_this()](beast::error_code error, size_t) {
                            if (error) return self->Close();
                            self->DiscardInput();
                          });
}

void HttpSession::Close() {
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream_.socket().close(ignored);
}

}  // namespace sieve
