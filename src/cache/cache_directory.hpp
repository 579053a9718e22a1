// Where the cache lives and whether it may be trusted: directory resolution, creation with mode
// 0700, the refusal of anything writable by other users, symlink refusal, network filesystems.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kiln::detail {

// KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; empty when none is set.
std::string default_cache_directory();
// KILN_CACHE_SEED entries (files, or directories holding kiln.db).
std::vector<std::string> default_seed_databases();

// Who may share the cache directory (KILN_CACHE_SHARED): the user alone (default), or a group the
// process is in (`group`: setgid directories with group write, as Kubernetes fsGroup volumes
// are; kiln then creates directories 2770 and files 0660). Throws kInvalidArgument for another
// value.
enum class CacheSharing { kUser, kGroup };
CacheSharing cache_sharing();
// The modes kiln creates cache directories and files with under the sharing policy.
unsigned cache_directory_mode();
unsigned cache_file_mode();

// Creates the directory (and missing parents) with cache_directory_mode() if it does not exist.
// Returns a reason when it cannot be used at all: not a directory, not creatable, or unsafe.
std::optional<std::string> prepare_cache_directory(const std::string& directory, bool create);

// A reason to refuse a directory or file: writable by group or others, owned by another user
// (other than root), or (for files) a symlink. nullopt when it may be used or does not exist.
std::optional<std::string> unsafe_reason(const std::string& path, bool is_directory);

// True on NFS, Lustre, GPFS, CIFS/SMB and similar, where SQLite's WAL and mmap are unsafe.
bool is_network_filesystem(const std::string& path);
bool is_network_filesystem_magic(long magic);

}  // namespace kiln::detail
