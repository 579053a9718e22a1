#include "cache/remote_tier.hpp"

#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <random>

#include <fmt/format.h>

#include "core/env.hpp"
#include "core/process_singleton.hpp"
#include "kiln/error.hpp"
#include "kiln/log.hpp"

namespace kiln::detail {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

int64_t bounded_setting(const char* name, int64_t fallback, int64_t low, int64_t high, const char* unit) {
  const std::optional<int64_t> v = env_int(name);
  if (!v) return fallback;
  if (*v < low || *v > high) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: {} is out of range; expected {} to {} {}", name, *v, low, high, unit));
  }
  return *v;
}

// Releases or renews a lease only while it is still this process's (compare and act, atomically).
constexpr const char* kReleaseScript = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
constexpr const char* kRenewScript =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

constexpr char kEntryMagic[8] = {'K', 'I', 'L', 'N', 'R', 'O', 'W', '1'};

void put_field(std::string& out, const void* data, size_t size) {
  const uint32_t n = static_cast<uint32_t>(size);
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(static_cast<const char*>(data), size);
}
void put_field(std::string& out, const std::string& text) { put_field(out, text.data(), text.size()); }

std::optional<KernelKey> key_from_hex(const std::string& hex) {
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) return std::nullopt;
  KernelKey k;
  k.high = std::stoull(hex.substr(0, 16), nullptr, 16);
  k.low = std::stoull(hex.substr(16), nullptr, 16);
  return k;
}

}  // namespace

std::optional<RemoteSettings> remote_settings_from_environment() {
  const auto url = env_string("KILN_CACHE_REMOTE");
  if (!url) return std::nullopt;
  RemoteSettings s;
  s.endpoint = parse_redis_url(*url, "KILN_CACHE_REMOTE");
  if (auto prefix = env_string("KILN_CACHE_REMOTE_PREFIX")) {
    if (prefix->size() > 200 || prefix->find_first_of(" \t\r\n") != std::string::npos) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("KILN_CACHE_REMOTE_PREFIX: '{}' must be at most 200 characters without spaces", *prefix));
    }
    s.prefix = *prefix;
  }
  s.ttl_seconds = bounded_setting("KILN_CACHE_REMOTE_TTL", s.ttl_seconds, 0, int64_t{10} * 365 * 24 * 3600, "seconds");
  s.timeout = std::chrono::milliseconds(bounded_setting("KILN_CACHE_REMOTE_TIMEOUT_MS", s.timeout.count(), 1, 60000, "milliseconds"));
  s.lease = std::chrono::milliseconds(bounded_setting("KILN_CACHE_REMOTE_LEASE_MS", s.lease.count(), 100, 3600000, "milliseconds"));
  s.wait = std::chrono::seconds(bounded_setting("KILN_CACHE_REMOTE_WAIT_S", 300, 0, 86400, "seconds"));
  s.cooldown = std::chrono::seconds(bounded_setting("KILN_CACHE_REMOTE_COOLDOWN_S", 30, 0, 86400, "seconds"));
  if (auto key = env_string("KILN_CACHE_SIGNING_KEY")) s.signing_key = read_signing_key(*key);
  try {
    s.trusted_keys = trusted_keys_from_environment();
  } catch (const Error& e) {
    s.trusted_keys_error = e.message();
  }
  return s;
}

std::string encode_remote_entry(const CacheRow& row, const SigningKey* signing_key) {
  std::string out(kEntryMagic, sizeof kEntryMagic);
  const std::string key = row.key.hex();
  for (const std::string* f :
       {&key, &row.kernel, &row.op, &row.signature, &row.target, &row.backend, &row.compiler, &row.options, &row.entry}) {
    put_field(out, *f);
  }
  put_field(out, fmt::format("{}", row.compile_ms));
  const uint64_t checksum = XXH3_64bits(row.binary.data(), row.binary.size());
  put_field(out, &checksum, sizeof checksum);
  if (signing_key != nullptr) {
    const RowSignature signature = sign_row(row, *signing_key);
    put_field(out, signing_key->public_key.data(), signing_key->public_key.size());
    put_field(out, signature.data(), signature.size());
  } else {
    put_field(out, "", 0);
    put_field(out, "", 0);
  }
  put_field(out, row.binary.data(), row.binary.size());
  return out;
}

std::variant<DecodedEntry, std::string> decode_remote_entry(const std::string& bytes) {
  if (bytes.size() < sizeof kEntryMagic || std::memcmp(bytes.data(), kEntryMagic, sizeof kEntryMagic) != 0) {
    return std::string("not a kiln entry (no KILNROW1 header)");
  }
  size_t at = sizeof kEntryMagic;
  std::vector<std::string> fields;
  while (at < bytes.size()) {
    uint32_t n = 0;
    if (bytes.size() - at < sizeof n) return std::string("truncated (a field's length is cut off)");
    std::memcpy(&n, bytes.data() + at, sizeof n);
    at += sizeof n;
    if (n > bytes.size() - at) return fmt::format("truncated (field {} claims {} bytes, {} remain)", fields.size(), n, bytes.size() - at);
    fields.emplace_back(bytes.data() + at, n);
    at += n;
  }
  if (fields.size() != 14) return fmt::format("{} fields where a kiln entry has 14", fields.size());
  DecodedEntry e;
  const auto key = key_from_hex(fields[0]);
  if (!key) return std::string("its key field is not 32 hex digits");
  e.row.key = *key;
  e.row.kernel = fields[1];
  e.row.op = fields[2];
  e.row.signature = fields[3];
  e.row.target = fields[4];
  e.row.backend = fields[5];
  e.row.compiler = fields[6];
  e.row.options = fields[7];
  e.row.entry = fields[8];
  char* end = nullptr;
  e.row.compile_ms = std::strtod(fields[9].c_str(), &end);
  if (fields[9].empty() || end != fields[9].c_str() + fields[9].size()) return std::string("its compile time is not a number");
  if (fields[10].size() != sizeof e.checksum) return std::string("its checksum is not 8 bytes");
  std::memcpy(&e.checksum, fields[10].data(), sizeof e.checksum);
  if (!fields[11].empty() || !fields[12].empty()) {
    PublicKey signer{};
    RowSignature signature{};
    if (fields[11].size() != signer.size() || fields[12].size() != signature.size()) {
      return std::string("its signature fields are not a 32-byte key and a 64-byte signature");
    }
    std::memcpy(signer.data(), fields[11].data(), signer.size());
    std::memcpy(signature.data(), fields[12].data(), signature.size());
    e.signature = std::make_pair(signer, signature);
  }
  e.row.binary.assign(fields[13].begin(), fields[13].end());
  return e;
}

RemoteTier* RemoteTier::process() {
  return ProcessSingleton<RemoteTier>::get([]() -> RemoteTier* {
    try {
      if (auto settings = remote_settings_from_environment()) return new RemoteTier(std::move(*settings));
    } catch (const Error& e) {
      log(LogLevel::kWarn, "kiln cache: no remote tier: " + e.message());
    }
    return nullptr;
  });
}

RemoteTier::RemoteTier(RemoteSettings settings) : settings_(std::move(settings)) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::random_device random;
  token_ = fmt::format("{}:{}:{:08x}{:08x}", host, ::getpid(), random(), random());
  if (!settings_.trusted_keys_error.empty()) {
    warn_once("keys", "kiln cache: KILN_CACHE_TRUSTED_KEYS cannot be used (" + settings_.trusted_keys_error +
                          "): no entry of the remote will be trusted");
  }
  // The writer may still run while the process exits (it drains its queue from an exit handler,
  // registered after this constructor). Whatever it uses with static storage is set up now, so
  // that it is destroyed after that handler has joined the writer, not before.
  log(LogLevel::kDebug, fmt::format("kiln cache: remote tier {} (prefix {})", settings_.endpoint.redacted, settings_.prefix));
  redis_client_problem();
  if (settings_.signing_key || !settings_.trusted_keys.empty()) {
    try {
      load_signing_library();
    } catch (const Error&) {
      // reported where a row is signed or verified
    }
  }
  writer_ = std::thread([this] { run_writer(); });
}

RemoteTier::~RemoteTier() {
  {
    std::lock_guard<std::mutex> lock(jobs_mutex_);
    stopping_ = true;
  }
  jobs_ready_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void RemoteTier::warn_once(const std::string& category, const std::string& message) {
  std::lock_guard<std::mutex> lock(warned_mutex_);
  if (warned_.emplace(category, true).second) log(LogLevel::kWarn, message);
}

bool RemoteTier::skipping() const { return now_ns() < skip_until_ns_.load(std::memory_order_relaxed); }

// A failure to connect, send or receive: the remote is skipped for the cool-down, and the first
// failure of each kind is logged (a dead server must not fill the log on every lookup).
void RemoteTier::trip(const std::string& why) {
  counters_.errors++;
  const int64_t until = now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(settings_.cooldown).count();
  skip_until_ns_.store(until, std::memory_order_relaxed);
  std::string kind = why;
  if (const size_t colon = why.find(": "); colon != std::string::npos) kind = why.substr(colon + 2, 40);
  warn_once("trip:" + kind,
            fmt::format("kiln cache: remote {} unavailable ({}); using the local tiers and compiling for {} s", settings_.endpoint.redacted,
                        why, std::chrono::duration_cast<std::chrono::seconds>(settings_.cooldown).count()));
}

std::unique_ptr<RedisConnection> RemoteTier::connect() {
  return std::make_unique<RedisConnection>(settings_.endpoint, settings_.timeout, settings_.timeout);
}

// Runs `use` on the callers' connection. A connection that was idle may have been closed by a
// restarted server: a failure on it is retried once on a fresh one before the remote is skipped.
template <typename F>
auto RemoteTier::with_connection(F&& use) -> std::optional<decltype(use(std::declval<RedisConnection&>()))> {
  if (skipping()) {
    counters_.skipped++;
    return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(connection_mutex_);
  for (int attempt = 0;; ++attempt) {
    const bool reused = connection_ != nullptr;
    try {
      if (!connection_) connection_ = connect();
      return use(*connection_);
    } catch (const Error& e) {
      connection_.reset();
      if (reused && attempt == 0) continue;
      trip(e.message());
      return std::nullopt;
    }
  }
}

std::optional<CacheRow> RemoteTier::fetch(const KernelKey& key, const std::string& target, const std::string& compiler) {
  const auto reply = with_connection([&](RedisConnection& c) { return c.command({"GET", entry_key(key)}); });
  if (!reply) return std::nullopt;
  if (reply->type == RedisReply::Type::kNil) return std::nullopt;
  if (reply->is_error()) {
    counters_.errors++;
    warn_once("get:" + reply->text.substr(0, 20),
              fmt::format("kiln cache: remote {} refused GET: {}", settings_.endpoint.redacted, reply->text));
    return std::nullopt;
  }
  counters_.bytes_read += reply->text.size();
  auto decoded = decode_remote_entry(reply->text);
  std::string why;
  if (auto* problem = std::get_if<std::string>(&decoded)) {
    why = *problem;
  } else {
    auto& e = std::get<DecodedEntry>(decoded);
    if (e.row.key != key) {
      why = "it is stored under another key's name (" + e.row.key.hex() + ")";
    } else if (e.row.target != target) {
      why = "it was built for " + e.row.target + ", not " + target;
    } else if (e.row.compiler != compiler) {
      why = "it was built by " + e.row.compiler + ", not " + compiler;
    } else if (e.row.binary.empty()) {
      why = "its binary is empty";
    } else if (XXH3_64bits(e.row.binary.data(), e.row.binary.size()) != e.checksum) {
      why = "its checksum does not match its binary";
    } else if (!settings_.trusted_keys_error.empty()) {
      why = "KILN_CACHE_TRUSTED_KEYS cannot be used, so nothing is trusted";
    } else if (!settings_.trusted_keys.empty()) {
      if (!e.signature) {
        why = "it is not signed, and KILN_CACHE_TRUSTED_KEYS is set";
      } else if (auto bad = signature_problem(e.row, settings_.trusted_keys, e.signature->first, e.signature->second)) {
        why = *bad;
      }
    }
    if (why.empty()) return std::move(e.row);
  }
  refuse(key, why);
  return std::nullopt;
}

void RemoteTier::refuse(const KernelKey& key, const std::string& why) {
  counters_.refused++;
  warn_once("refused:" + key.hex(), fmt::format("kiln cache: refused the entry for key {} from remote {}: {}; it is not loaded", key.hex(),
                                                settings_.endpoint.redacted, why));
}

std::vector<std::string> RemoteTier::compiler_identities(const std::string& target) {
  const auto reply = with_connection([&](RedisConnection& c) {
    return c.command({"ZREVRANGE", settings_.prefix + "compilers:" + target, "0", "15"});
  });
  std::vector<std::string> out;
  if (!reply || reply->type != RedisReply::Type::kArray) return out;
  for (const auto& e : reply->elements) {
    if (e.type == RedisReply::Type::kString) out.push_back(e.text);
  }
  return out;
}

RemoteTier::Lease RemoteTier::take_lease(const KernelKey& key) {
  const std::string ttl = std::to_string(settings_.lease.count());
  const auto reply = with_connection([&](RedisConnection& c) { return c.command({"SET", lease_key(key), token_, "NX", "PX", ttl}); });
  if (!reply) return Lease::kUnavailable;
  if (reply->is_error()) {
    counters_.errors++;
    warn_once("lease:" + reply->text.substr(0, 20), fmt::format("kiln cache: remote {} refused a compile lease ({}); compiling without one",
                                                                settings_.endpoint.redacted, reply->text));
    return Lease::kUnavailable;
  }
  if (reply->type == RedisReply::Type::kNil) return Lease::kHeldElsewhere;
  std::lock_guard<std::mutex> lock(jobs_mutex_);
  held_leases_.emplace(key.hex(), key);
  return Lease::kTaken;
}

bool RemoteTier::lease_held(const KernelKey& key) {
  const auto reply = with_connection([&](RedisConnection& c) { return c.command({"EXISTS", lease_key(key)}); });
  return reply && reply->type == RedisReply::Type::kInteger && reply->integer == 1;
}

void RemoteTier::release_lease(const KernelKey& key) {
  std::lock_guard<std::mutex> lock(jobs_mutex_);
  jobs_.push_back(Job{std::nullopt, key});
  jobs_ready_.notify_one();
}

void RemoteTier::publish_later(const CacheRow& row) {
  std::lock_guard<std::mutex> lock(jobs_mutex_);
  const bool release = held_leases_.count(row.key.hex()) != 0;
  if (jobs_.size() >= settings_.queue_limit) {
    counters_.publish_dropped++;
    if (release) jobs_.push_back(Job{std::nullopt, row.key});  // the lease is still given back
  } else {
    jobs_.push_back(Job{row, release ? std::optional<KernelKey>(row.key) : std::nullopt});
  }
  jobs_ready_.notify_one();
}

std::optional<std::string> RemoteTier::write_row(RedisConnection& connection, const CacheRow& row, const SigningKey* signing_key) {
  const std::string value = encode_remote_entry(row, signing_key);
  std::vector<std::string_view> set = {"SET", "", value};
  const std::string key = entry_key(row.key);
  set[1] = key;
  const std::string ttl = std::to_string(settings_.ttl_seconds);
  if (settings_.ttl_seconds > 0) {
    set.push_back("EX");
    set.push_back(ttl);
  }
  const RedisReply reply = connection.command(set);
  if (reply.is_error()) {
    counters_.errors++;
    return fmt::format("{}: SET refused: {}", settings_.endpoint.redacted, reply.text);
  }
  counters_.bytes_written += value.size();
  counters_.publishes++;
  // The compiler identities a node without a compiler looks this target's keys up by.
  const std::string now =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  connection.command({"ZADD", settings_.prefix + "compilers:" + row.target, now, row.compiler});
  return std::nullopt;
}

void RemoteTier::publish_now(const CacheRow& row, const SigningKey* signing_key) {
  if (signing_key == nullptr && settings_.signing_key) signing_key = &*settings_.signing_key;
  std::lock_guard<std::mutex> lock(connection_mutex_);
  for (int attempt = 0;; ++attempt) {
    const bool reused = connection_ != nullptr;
    std::optional<std::string> refused;
    try {
      if (!connection_) connection_ = connect();
      refused = write_row(*connection_, row, signing_key);
    } catch (const Error& e) {
      connection_.reset();
      if (reused && attempt == 0) continue;
      counters_.errors++;
      throw Error(ErrorCode::kCacheError, e.message());
    }
    if (refused) throw Error(ErrorCode::kCacheError, *refused);
    return;
  }
}

void RemoteTier::renew_leases(RedisConnection& connection) {
  std::vector<KernelKey> held;
  {
    std::lock_guard<std::mutex> lock(jobs_mutex_);
    for (const auto& [hex, key] : held_leases_) held.push_back(key);
  }
  const std::string ttl = std::to_string(settings_.lease.count());
  for (const KernelKey& key : held) connection.command({"EVAL", kRenewScript, "1", lease_key(key), token_, ttl});
}

// The fleet's counters (a hash under the prefix) gain what this process counted since the last
// flush: every node adds its own, so `kiln cache stats` shows the whole fleet.
void RemoteTier::flush_fleet_counts(RedisConnection& connection) {
  const std::pair<const char*, uint64_t> counts[] = {{"hits", counters_.hits},
                                                     {"misses", counters_.misses},
                                                     {"refused", counters_.refused},
                                                     {"publishes", counters_.publishes},
                                                     {"lease_waits", counters_.lease_waits},
                                                     {"lease_takeovers", counters_.lease_takeovers},
                                                     {"publish_dropped", counters_.publish_dropped},
                                                     {"compiles", counters_.compiles}};
  for (const auto& [name, value] : counts) {
    uint64_t& done = flushed_[name];
    if (value == done) continue;
    connection.command({"HINCRBY", settings_.prefix + "stats", name, std::to_string(value - done)});
    flushed_total_ += value - done;
    done = value;
  }
}

bool RemoteTier::counts_pending() const {
  return counters_.hits + counters_.misses + counters_.refused + counters_.publishes + counters_.lease_waits + counters_.lease_takeovers +
             counters_.publish_dropped + counters_.compiles !=
         flushed_total_;
}

// The background writer: publishes queued rows in order, releases leases after their rows,
// renews the leases held while their keys compile, and adds this process's counts to the fleet's.
// It connects only when it has something to send.
void RemoteTier::run_writer() {
  std::unique_ptr<RedisConnection> connection;
  const auto tick = std::min<std::chrono::milliseconds>(settings_.lease / 3, std::chrono::seconds(5));
  auto next_tick = Clock::now() + tick;
  std::optional<Clock::time_point> deadline;  // once stopping: how long the queue may still take
  auto use = [&](auto&& send) {
    if (skipping() || (deadline && Clock::now() > *deadline)) return false;
    try {
      if (!connection) connection = connect();
      send(*connection);
      return true;
    } catch (const Error& e) {
      connection.reset();
      trip(e.message());
      return false;
    }
  };
  auto release = [&](const KernelKey& key) {
    use([&](RedisConnection& c) { c.command({"EVAL", kReleaseScript, "1", lease_key(key), token_}); });
    std::lock_guard<std::mutex> lock(jobs_mutex_);
    held_leases_.erase(key.hex());  // released, or it lapses on the server by itself
  };
  while (true) {
    std::optional<Job> job;
    bool stop = false;
    bool holding = false;
    {
      std::unique_lock<std::mutex> lock(jobs_mutex_);
      jobs_ready_.wait_until(lock, next_tick, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_ && !deadline) deadline = Clock::now() + std::chrono::seconds(5);
      if (!jobs_.empty()) {
        job = std::move(jobs_.front());
        jobs_.pop_front();
      } else {
        stop = stopping_;
      }
      holding = !held_leases_.empty();
    }
    if (job && job->row) {
      const CacheRow& row = *job->row;
      std::optional<std::string> refused;
      if (!use([&](RedisConnection& c) { refused = write_row(c, row, settings_.signing_key ? &*settings_.signing_key : nullptr); })) {
        counters_.publish_dropped++;
      } else if (refused) {  // a full server (OOM), say: reads go on, this row is not shared
        counters_.publish_dropped++;
        warn_once("publish:" + refused->substr(refused->find(": ") + 2, 30), "kiln cache: " + *refused + "; the row stays local");
      }
    }
    if (job && job->release) release(*job->release);
    if (stop) {
      std::vector<KernelKey> unfinished;  // compiles that never finished: their leases go back
      {
        std::lock_guard<std::mutex> lock(jobs_mutex_);
        for (const auto& [hex, key] : held_leases_) unfinished.push_back(key);
      }
      for (const KernelKey& key : unfinished) release(key);
      if (counts_pending()) use([&](RedisConnection& c) { flush_fleet_counts(c); });
      return;
    }
    if (Clock::now() >= next_tick) {
      if (holding) use([&](RedisConnection& c) { renew_leases(c); });
      if (counts_pending()) use([&](RedisConnection& c) { flush_fleet_counts(c); });
      next_tick = Clock::now() + tick;
    }
  }
}

RemoteCacheStats RemoteTier::stats() {
  RemoteCacheStats s;
  s.url = settings_.endpoint.redacted;
  s.prefix = settings_.prefix;
  s.state = "on";
  if (skipping()) {
    std::lock_guard<std::mutex> lock(warned_mutex_);
    s.state = "skipping after a failure (see the warning)";
  }
  s.hits = counters_.hits;
  s.misses = counters_.misses;
  s.refused = counters_.refused;
  s.errors = counters_.errors;
  s.skipped = counters_.skipped;
  s.bytes_read = counters_.bytes_read;
  s.bytes_written = counters_.bytes_written;
  s.publishes = counters_.publishes;
  s.publish_dropped = counters_.publish_dropped;
  s.lease_waits = counters_.lease_waits;
  s.lease_takeovers = counters_.lease_takeovers;
  return s;
}

RemoteCacheProbe RemoteTier::probe() {
  RemoteCacheProbe p;
  p.url = settings_.endpoint.redacted;
  std::lock_guard<std::mutex> lock(connection_mutex_);
  try {
    if (!connection_) connection_ = connect();
    const auto start = Clock::now();
    const RedisReply pong = connection_->command({"PING"});
    p.round_trip_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (pong.is_error()) throw Error(ErrorCode::kCacheError, fmt::format("{}: PING refused: {}", p.url, pong.text));
    const RedisReply fleet = connection_->command({"HGETALL", settings_.prefix + "stats"});
    for (size_t i = 0; i + 1 < fleet.elements.size(); i += 2) {
      p.fleet.emplace_back(fleet.elements[i].text, std::strtoull(fleet.elements[i + 1].text.c_str(), nullptr, 10));
    }
  } catch (const Error& e) {
    connection_.reset();
    throw Error(ErrorCode::kCacheError, e.message());
  }
  return p;
}

}  // namespace kiln::detail
