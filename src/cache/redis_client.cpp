#include "cache/redis_client.hpp"

#include <sys/time.h>

#include <cctype>
#include <cstring>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "core/dynamic_library.hpp"
#include "core/env.hpp"
#include "kiln/error.hpp"

#if KILN_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#define KILN_STRINGIFY_INNER(x) #x
#define KILN_STRINGIFY(x) KILN_STRINGIFY_INNER(x)
#endif

namespace kiln::detail {
namespace {

Error invalid(const std::string& what, const std::string& url, const std::string& why) {
  return Error(ErrorCode::kInvalidArgument,
               fmt::format("{}: '{}' is not a Redis URL ({}); expected redis://[user:password@]host[:port][/db]", what, url, why));
}

std::string percent_decoded(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

int parse_number(const std::string& text, int low, int high, const std::string& what, const std::string& url, const char* field) {
  if (text.empty() || text.size() > 6 || text.find_first_not_of("0123456789") != std::string::npos) {
    throw invalid(what, url, fmt::format("{} '{}' is not a number", field, text));
  }
  const int value = std::stoi(text);
  if (value < low || value > high) throw invalid(what, url, fmt::format("{} {} is not in {}..{}", field, value, low, high));
  return value;
}

}  // namespace

RedisEndpoint parse_redis_url(const std::string& url, const std::string& what) {
  RedisEndpoint e;
  if (url.rfind("rediss://", 0) == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: '{}' asks for TLS, which the hiredis kiln loads (Debian's 0.14) does not offer; use redis:// "
                            "over a trusted network or a TLS tunnel (stunnel, a service mesh)",
                            what, url));
  }
  if (url.rfind("redis://", 0) != 0) throw invalid(what, url, "it does not start with redis://");
  std::string rest = url.substr(8);
  std::string credentials;
  if (const size_t at = rest.rfind('@'); at != std::string::npos) {
    credentials = rest.substr(0, at);
    rest = rest.substr(at + 1);
  }
  std::string path;
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }
  std::string port;
  if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) throw invalid(what, url, "an unclosed [ in the host");
    e.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') throw invalid(what, url, "text after the ]");
      port = rest.substr(close + 2);
    }
  } else {
    const size_t colon = rest.rfind(':');
    e.host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  if (e.host.empty()) throw invalid(what, url, "no host");
  if (!port.empty() || rest.find(':') != std::string::npos) e.port = parse_number(port, 1, 65535, what, url, "port");
  if (!path.empty()) e.db = parse_number(path, 0, 100000, what, url, "database");
  std::string shown_credentials;
  if (!credentials.empty()) {
    const size_t colon = credentials.find(':');
    if (colon == std::string::npos) {
      e.password = percent_decoded(credentials);  // redis://password@host, as redis-cli -u takes it
      shown_credentials = "***@";
    } else {
      e.user = percent_decoded(credentials.substr(0, colon));
      e.password = percent_decoded(credentials.substr(colon + 1));
      shown_credentials = credentials.substr(0, colon) + ":***@";
    }
  }
  e.redacted = fmt::format("redis://{}{}:{}/{}", shown_credentials, e.host.find(':') != std::string::npos ? "[" + e.host + "]" : e.host,
                           e.port, e.db);
  return e;
}

#if KILN_HAVE_HIREDIS

namespace {

// The hiredis functions kiln calls; the types come from the header of the same soname.
struct Hiredis {
  redisContext* (*connect_with_timeout)(const char*, int, const struct timeval);
  int (*set_timeout)(redisContext*, const struct timeval);
  void* (*command_argv)(redisContext*, int, const char**, const size_t*);
  void (*free_reply)(void*);
  void (*free_context)(redisContext*);
};

const Hiredis& hiredis() {
  static std::once_flag once;
  static Hiredis h{};
  static OptionalLibrary library;
  std::call_once(once, [] {
    std::vector<std::string> candidates = {"libhiredis.so." KILN_STRINGIFY(HIREDIS_SONAME)};
    if (auto path = env_string("KILN_LIBHIREDIS")) candidates = {*path};
    library =
        load_optional_library("hiredis " KILN_STRINGIFY(HIREDIS_SONAME) " (the remote cache tier; Debian: libhiredis0.14)", candidates);
    if (!library.library) return;
    try {
      h.connect_with_timeout = reinterpret_cast<decltype(h.connect_with_timeout)>(library.library->symbol("redisConnectWithTimeout"));
      h.set_timeout = reinterpret_cast<decltype(h.set_timeout)>(library.library->symbol("redisSetTimeout"));
      h.command_argv = reinterpret_cast<decltype(h.command_argv)>(library.library->symbol("redisCommandArgv"));
      h.free_reply = reinterpret_cast<decltype(h.free_reply)>(library.library->symbol("freeReplyObject"));
      h.free_context = reinterpret_cast<decltype(h.free_context)>(library.library->symbol("redisFree"));
    } catch (const Error& e) {
      library.failure = e.message();
      library.library.reset();
    }
  });
  if (!library.library) throw Error(ErrorCode::kCacheError, "the remote cache tier needs hiredis: " + library.failure);
  return h;
}

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

RedisReply convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING: out.type = RedisReply::Type::kString; break;
    case REDIS_REPLY_ARRAY: out.type = RedisReply::Type::kArray; break;
    case REDIS_REPLY_INTEGER: out.type = RedisReply::Type::kInteger; break;
    case REDIS_REPLY_STATUS: out.type = RedisReply::Type::kStatus; break;
    case REDIS_REPLY_ERROR: out.type = RedisReply::Type::kError; break;
    default: out.type = RedisReply::Type::kNil;
  }
  if (r->str != nullptr) out.text.assign(r->str, r->len);
  out.integer = r->integer;
  for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
  return out;
}

}  // namespace

RedisConnection::RedisConnection(const RedisEndpoint& endpoint, std::chrono::milliseconds connect_timeout,
                                 std::chrono::milliseconds command_timeout)
    : where_(endpoint.redacted) {
  const Hiredis& h = hiredis();
  auto* c = h.connect_with_timeout(endpoint.host.c_str(), endpoint.port, to_timeval(connect_timeout));
  if (c == nullptr) throw Error(ErrorCode::kCacheError, fmt::format("{}: cannot allocate a connection", where_));
  context_ = c;
  if (c->err) {
    const std::string why = c->errstr;
    h.free_context(c);
    context_ = nullptr;
    throw Error(ErrorCode::kCacheError, fmt::format("{}: cannot connect: {}", where_, why));
  }
  h.set_timeout(c, to_timeval(command_timeout));
  auto require_ok = [&](const RedisReply& r, const char* step) {
    if (r.is_error()) {
      h.free_context(c);
      context_ = nullptr;
      throw Error(ErrorCode::kCacheError, fmt::format("{}: {} refused: {}", where_, step, r.text));
    }
  };
  if (!endpoint.password.empty()) {
    require_ok(endpoint.user.empty() ? command({"AUTH", endpoint.password}) : command({"AUTH", endpoint.user, endpoint.password}), "AUTH");
  }
  if (endpoint.db != 0) require_ok(command({"SELECT", std::to_string(endpoint.db)}), "SELECT");
}

RedisConnection::~RedisConnection() {
  if (context_ != nullptr) hiredis().free_context(static_cast<redisContext*>(context_));
}

RedisReply RedisConnection::command(const std::vector<std::string_view>& arguments) {
  if (context_ == nullptr) throw Error(ErrorCode::kCacheError, fmt::format("{}: the connection was lost", where_));
  const Hiredis& h = hiredis();
  auto* c = static_cast<redisContext*>(context_);
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const auto& a : arguments) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  auto* reply = static_cast<redisReply*>(h.command_argv(c, static_cast<int>(argv.size()), argv.data(), lengths.data()));
  if (reply == nullptr) {
    // A timeout or a closed socket: hiredis marks the context failed for good.
    const std::string why = c->errstr[0] ? c->errstr : "no reply";
    h.free_context(c);
    context_ = nullptr;
    throw Error(ErrorCode::kCacheError, fmt::format("{}: {} failed: {}", where_, arguments.empty() ? "" : arguments[0], why));
  }
  RedisReply out = convert(reply);
  h.free_reply(reply);
  return out;
}

std::string redis_client_problem() {
  try {
    hiredis();
    return "";
  } catch (const Error& e) {
    return e.message();
  }
}

#else  // built without hiredis's header

RedisConnection::RedisConnection(const RedisEndpoint& endpoint, std::chrono::milliseconds, std::chrono::milliseconds)
    : where_(endpoint.redacted) {
  throw Error(ErrorCode::kCacheError, redis_client_problem());
}
RedisConnection::~RedisConnection() = default;
RedisReply RedisConnection::command(const std::vector<std::string_view>&) { return {}; }
std::string redis_client_problem() {
  return "this libkiln was built without hiredis (install libhiredis-dev and rebuild) and has no remote cache tier";
}

#endif

}  // namespace kiln::detail
