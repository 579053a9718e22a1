// A real redis-server (Debian's package) on a loopback port of its own, for one test: started in
// the constructor, killed in the destructor, and killable or restartable in between.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cache/redis_client.hpp"
#include "kiln/error.hpp"

namespace kiln::test {

class RedisServer {
 public:
  // `extra`: more redis-server arguments, e.g. {"--requirepass", "secret"}.
  RedisServer(const std::string& directory, std::vector<std::string> extra = {}) : directory_(directory), extra_(std::move(extra)) {
    std::filesystem::create_directories(directory_);
    for (int attempt = 0; attempt < 5 && pid_ <= 0; ++attempt) {
      port_ = free_port();
      start();
    }
    if (pid_ <= 0) throw std::runtime_error("redis-server did not start; see " + directory_ + "/redis.log");
  }
  ~RedisServer() { kill(SIGKILL); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  static bool installed() { return !executable().empty(); }

  int port() const { return port_; }
  std::string url(const std::string& credentials = "") const {
    return fmt::format("redis://{}127.0.0.1:{}", credentials.empty() ? "" : credentials + "@", port_);
  }
  detail::RedisEndpoint endpoint(const std::string& password = "") const {
    detail::RedisEndpoint e;
    e.host = "127.0.0.1";
    e.port = port_;
    e.password = password;
    e.redacted = url();
    return e;
  }
  // An administrative connection (generous timeouts), for setting up and inspecting.
  detail::RedisReply admin(const std::vector<std::string_view>& command, const std::string& password = "") const {
    detail::RedisConnection c(endpoint(password), std::chrono::milliseconds(2000), std::chrono::milliseconds(5000));
    return c.command(command);
  }

  void kill(int signal) {
    if (pid_ <= 0) return;
    ::kill(pid_, signal);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Starts again on the same port, empty.
  void restart() {
    kill(SIGKILL);
    for (int attempt = 0; attempt < 50 && pid_ <= 0; ++attempt) {
      start();
      if (pid_ <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (pid_ <= 0) throw std::runtime_error("redis-server did not restart");
  }

 private:
  static std::string executable() {
    for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
      if (::access(p, X_OK) == 0) return p;
    }
    return "";
  }
  static int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    ::close(fd);
    return ntohs(a.sin_port);
  }
  void start() {
    std::vector<std::string> args = {executable(),
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     directory_,
                                     "--logfile",
                                     directory_ + "/redis.log",
                                     "--enable-debug-command",
                                     "yes"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pid_ = pid;
    const std::string password = password_argument();
    for (int i = 0; i < 500; ++i) {  // up to 5 s for the first PONG
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // exited: the port was taken, say
        pid_ = -1;
        return;
      }
      try {
        if (admin({"PING"}, password).text == "PONG") return;
      } catch (const Error&) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(SIGKILL);
  }
  std::string password_argument() const {
    for (size_t i = 0; i + 1 < extra_.size(); ++i) {
      if (extra_[i] == "--requirepass") return extra_[i + 1];
    }
    return "";
  }

  std::string directory_;
  std::vector<std::string> extra_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace kiln::test
