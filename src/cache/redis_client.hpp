// A synchronous Redis connection through hiredis. libkiln loads hiredis (dlopen) only when a remote
// tier is configured, so it starts and runs on machines without it; the header is needed at build
// time (Debian: libhiredis-dev) and the library loaded is the one of that header's soname, whose
// reply layout the header describes.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::detail {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  std::string user, password;  // user empty: AUTH with the password alone
  int db = 0;
  std::string redacted;  // the URL with the password replaced by ***, for logs and reports
};

// Parses redis://[user:password@]host[:port][/db]. `what` names the setting in errors
// (kInvalidArgument). rediss:// is refused: the hiredis kiln loads (0.14) has no TLS.
RedisEndpoint parse_redis_url(const std::string& url, const std::string& what);

struct RedisReply {
  enum class Type { kString, kArray, kInteger, kNil, kStatus, kError };
  Type type = Type::kNil;
  std::string text;  // string, status or error
  long long integer = 0;
  std::vector<RedisReply> elements;

  bool is_error() const { return type == Type::kError; }
};

// One connection. Every failure to connect, send or receive (a timeout, a closed socket) throws
// kiln::Error(kCacheError) and leaves the connection unusable; an error reply from the server is
// returned as a reply of type kError.
class RedisConnection {
 public:
  // Connects, authenticates and selects the database, each bounded by the timeouts (the command
  // timeout bounds each socket read and write).
  RedisConnection(const RedisEndpoint& endpoint, std::chrono::milliseconds connect_timeout, std::chrono::milliseconds command_timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  RedisReply command(const std::vector<std::string_view>& arguments);

 private:
  void* context_ = nullptr;  // redisContext
  std::string where_;
};

// Why hiredis cannot be used here, or empty: for `kiln env`.
std::string redis_client_problem();

}  // namespace kiln::detail
