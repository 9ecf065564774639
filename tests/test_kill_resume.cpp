// kill -9 at any moment, then resume: always from a checkpoint that verifies, always ending with
// the weights of the run that was never interrupted. The program is its own child:
//   xpipe_test_kill_resume                  the test: times an uninterrupted run, then kills a
//                                           run at 10 points spread over that time and resumes
//   xpipe_test_kill_resume train <folder>   trains 12 epochs, resuming from the newest checkpoint
//                                           that verifies, checkpointing after every epoch; writes
//                                           the final weights' CRC-32 to <folder>/final
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

extern char** environ;

namespace fs = std::filesystem;
using namespace xpipe;

namespace {
using S0 = Stage<Linear<12, 32>, ReLU>;
using S1 = Stage<Linear<32, 32>, GELU>;
using S2 = Stage<Linear<32, 4>>;
using P = Pipeline<S0, S1, S2, XPipe, Adam>;
constexpr int epochs = 12;

int train(const fs::path& folder) {
  P pipe(Adam{.lr = 1e-2f}, {.batch = 16, .micro_batches = 2, .seed = 5});
  int first = 0;
  if (const auto found = find_latest_checkpoint(folder)) {
    first = std::stoi(load_checkpoint(pipe, found->contents).at("epoch"));
    for (const std::string& s : found->skipped) std::printf("passed over %s\n", s.c_str());
  }
  ReferenceExecutor exec;
  for (int e = first; e < epochs; ++e) {
    const auto d = test::random_classification(16 * 8, 12, 4, 1000 + static_cast<unsigned>(e));
    pipe.train(async_1f1b(3, 2, 8), d.epoch(), exec);
    char name[32];
    std::snprintf(name, sizeof name, "ckpt-%06d", e + 1);
    save_checkpoint(pipe, folder, name, {{"epoch", std::to_string(e + 1)}});
  }
  const std::vector<float> w = pipe.weights();
  const auto crc = crc32(0L, reinterpret_cast<const Bytef*>(w.data()),
                         static_cast<uInt>(w.size() * sizeof(float)));
  std::ofstream(folder / "final") << crc << "\n";
  return 0;
}

pid_t spawn_child(const char* self, const fs::path& folder) {
  const std::string f = folder.string();
  char* argv[] = {const_cast<char*>(self), const_cast<char*>("train"), const_cast<char*>(f.c_str()),
                  nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, self, nullptr, nullptr, argv, environ) != 0) {
    std::perror("posix_spawn");
    std::exit(1);
  }
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// Runs a child to completion; returns its final CRC, or "" when it failed.
std::string run_to_end(const char* self, const fs::path& folder) {
  const int status = wait_child(spawn_child(self, folder));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "";
  return test::read_text(folder / "final");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "train") {
    try {
      return train(argv[2]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      return 1;
    }
  }
  const char* self = argv[0];
  const fs::path root = test::scratch_dir("kill_resume");
  fs::remove_all(root);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string straight = run_to_end(self, root / "straight");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (straight.empty()) {
    std::printf("FAIL: the uninterrupted run failed\n");
    return 1;
  }
  int failures = 0, mid_write = 0;
  for (int i = 0; i < 10; ++i) {
    const fs::path folder = root / ("killed-" + std::to_string(i));
    const pid_t pid = spawn_child(self, folder);
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds * (i + 0.5) / 10));
    kill(pid, SIGKILL);
    wait_child(pid);
    // What the kill left: a folder without a MANIFEST or a .tmp file means it hit a write.
    bool hit_write = false;
    if (fs::exists(folder))
      for (const auto& e : fs::recursive_directory_iterator(folder))
        hit_write |= e.path().extension() == ".tmp" ||
                     (e.is_directory() && !fs::exists(e.path() / "MANIFEST"));
    mid_write += hit_write;
    std::string verdict;
    try {
      const auto found = find_latest_checkpoint(folder);
      verdict = found ? "resumes from " + found->contents.folder.filename().string()
                      : "no checkpoint yet";
    } catch (const Error& e) {
      verdict = std::string("ERROR ") + e.what();
      ++failures;
    }
    const std::string resumed = run_to_end(self, folder);
    const bool same = resumed == straight;
    failures += !same;
    std::printf("kill %d at %.0f%% (%s): %s, final weights %s\n", i, 100 * (i + 0.5) / 10,
                hit_write ? "mid-write" : "between writes", verdict.c_str(),
                same ? "bitwise equal" : "DIFFER");
  }
  std::printf("%d of 10 kills landed inside a checkpoint write; %d failures\n", mid_write,
              failures);
  return failures == 0 ? 0 : 1;
}
