// Checked, crash-safe file output for xpipe-train: the output folder checked before any work,
// whole files replaced atomically, an append-only CSV written through, and programs run without
// a shell. Every failure names the file.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "xpipe/core/error.hpp"

namespace xpipe::tools {

//! A file of the output folder could not be written: the message names it and says why.
class OutputError : public Error {
 public:
  OutputError(const std::filesystem::path& file, int err)
      : Error("cannot write '" + file.string() + "': " + std::strerror(err)) {}
};

namespace detail {

// write(2) until all of text is out, through short writes and EINTR; 0 or the errno.
inline int write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return 0;
}

// fsync, where the file supports it (a pipe or character device does not: EINVAL, nothing to
// make durable there); 0 or the errno.
inline int sync_fd(int fd) {
  return ::fsync(fd) == 0 || errno == EINVAL ? 0 : errno;
}

// Creates the temporary `tmp` for writing: a stale one (an earlier write cut short) is removed
// first, and the open follows no symbolic link and takes no file that appeared meanwhile, so a
// link planted under the temporary's name is never written through. The fd, or -1 with errno.
inline int create_temporary(const std::filesystem::path& tmp) {
  ::unlink(tmp.c_str());  // a link itself, never what it points to
  return ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
}

}  // namespace detail

//! Makes the folder `dir` (and its parents) if missing and checks that a file can be created in
//! it. Returns "" when it can hold the outputs, else what is wrong (for a usage error).
//! Usage: `if (auto why = prepare_output_dir(out); !why.empty()) ...`
inline std::string prepare_output_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  if (dir.empty()) return "is empty";
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st)) return "exists and is not a directory";
  if (!fs::exists(st)) {
    fs::create_directories(dir, ec);
    if (ec) return "cannot create the folder: " + ec.message();
  }
  // A probe file, not access(2): access says yes to root on a read-only file system.
  const fs::path probe = dir / (".xpipe-probe-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return std::string("cannot create files in it: ") + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

//! Replaces `path` by `text` all at once: written to a temporary name in the same folder,
//! fsync'ed, then renamed over `path`, so a reader, a crash or a signal sees the old file or the
//! new one, never part of one. Throws OutputError naming `path`.
inline void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  const std::filesystem::path tmp =
      path.parent_path() / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  const int fd = detail::create_temporary(tmp);
  if (fd < 0) throw OutputError(path, errno);
  int err = detail::write_all(fd, text);
  if (err == 0) err = detail::sync_fd(fd);
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw OutputError(path, err);
  }
  // The rename itself lasts through a power loss once the folder is synced. Not every file
  // system can sync a folder, and the file is complete either way, so a failure here is not one
  // of the write.
  const int dir = ::open(path.parent_path().empty() ? "." : path.parent_path().c_str(),
                         O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

//! A file that grows by appends: truncated when opened; each append goes straight to the file
//! (no buffer in this process) and is fsync'ed, so what was appended outlives the process.
//! Throws OutputError naming the file. Usage: `AppendFile csv(dir / "runs.csv"); csv.append(row);`
class AppendFile {
 public:
  explicit AppendFile(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0666);
    if (fd_ < 0) throw OutputError(path_, errno);
  }
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile() { ::close(fd_); }

  void append(std::string_view text) {
    int err = detail::write_all(fd_, text);
    if (err == 0) err = detail::sync_fd(fd_);
    if (err != 0) throw OutputError(path_, err);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

//! Advisory locks on folders, so that two processes never write one folder at once (two studies
//! into one --out would mix their rows; two runs into one checkpoint folder would refuse each
//! other's checkpoints after training). Each lock is flock(2) on `<folder>/.xpipe-train.lock`:
//! held until this object goes or the process ends in any way (kill -9 included), so a stale
//! lock file never blocks anyone. The file says who holds it, for the message of the one refused.
//! Usage: `FolderLocks locks; if (auto why = locks.take(out, "--out"); !why.empty()) ...`
class FolderLocks {
 public:
  FolderLocks() = default;
  FolderLocks(const FolderLocks&) = delete;
  FolderLocks& operator=(const FolderLocks&) = delete;
  ~FolderLocks() {
    for (const Held& h : held_) ::close(h.fd);
  }

  //! Locks the existing folder `dir` (named `what` in messages). Returns "" when this process
  //! holds it, else why not, naming the holder. A folder this object holds already is held.
  std::string take(const std::filesystem::path& dir, const std::string& what) {
    std::error_code ec;
    const std::filesystem::path key = std::filesystem::weakly_canonical(dir, ec);
    for (const Held& h : held_)
      if (h.dir == (ec ? dir : key)) return "";
    const std::filesystem::path file = dir / ".xpipe-train.lock";
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0)
      return what + " '" + dir.string() + "': cannot create its lock file " + file.string() + ": " +
             std::strerror(errno);
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      std::string holder(512, '\0');
      const ssize_t n = ::pread(fd, holder.data(), holder.size(), 0);
      holder.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
      ::close(fd);
      if (err != EWOULDBLOCK)
        return what + " '" + dir.string() + "': cannot lock " + file.string() + ": " +
               std::strerror(err);
      return what + " '" + dir.string() + "' is in use by another xpipe-train (" +
             (holder.empty() ? "it has not said which yet" : holder) +
             "); wait for it to end or choose another folder";
    }
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    char when[64] = "";
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    if (::gmtime_r(&now, &utc) != nullptr)
      std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
    const std::string text =
        "pid " + std::to_string(::getpid()) + " on " + host + ", started " + when + "\n";
    // The holder's text is a courtesy to the refused: a failure to write it is not an error.
    if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, text.data(), text.size(), 0);
    held_.push_back({ec ? dir : key, fd});
    return "";
  }

 private:
  struct Held {
    std::filesystem::path dir;
    int fd;
  };
  std::vector<Held> held_;
};

//! The executable `name` in $PATH (as a shell would find it), or "" when there is none.
inline std::string find_program(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/bin:/bin";
  while (true) {
    const std::size_t colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (colon == std::string_view::npos) return "";
    dirs.remove_prefix(colon + 1);
  }
}

//! Runs the program at `exe` with `args` (args[0] its name) in the folder `cwd` and waits for
//! it. No shell is involved, so no character of a path or argument is special. The program's
//! stdout goes to this process's stderr (here it is diagnostics). Returns "" when it exited
//! with status 0, else what happened.
inline std::string run_program(const std::string& exe, const std::vector<std::string>& args,
                               const std::filesystem::path& cwd) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string dir = cwd.string();
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  const pid_t pid = ::fork();
  if (pid < 0) return std::string("could not be started: ") + std::strerror(errno);
  if (pid == 0) {
    // The child of a threaded process: async-signal-safe calls only until exec. An ignored
    // SIGPIPE would be inherited through exec; handled signals are reset by exec itself.
    ::sigaction(SIGPIPE, &default_action, nullptr);
    if (::chdir(dir.c_str()) != 0) ::_exit(126);
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return std::string("could not be waited for: ") + std::strerror(errno);
  if (WIFEXITED(status)) {
    switch (WEXITSTATUS(status)) {
      case 0:
        return "";
      case 126:
        return "could not enter '" + dir + "'";
      case 127:
        return "could not be executed";
      default:
        return "exited with status " + std::to_string(WEXITSTATUS(status));
    }
  }
  if (WIFSIGNALED(status)) return std::string("was killed by ") + ::strsignal(WTERMSIG(status));
  return "stopped abnormally";
}

}  // namespace xpipe::tools
