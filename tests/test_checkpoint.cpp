// Checkpoints: resume is exact (bitwise, every schedule x predictor), and every damaged,
// foreign or mismatched checkpoint is refused with the file and field named.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {
using S0 = Stage<Linear<12, 16>, ReLU>;
using S1 = Stage<Linear<16, 16>, GELU>;
using S2 = Stage<Linear<16, 4>>;

constexpr PipelineOptions options{.batch = 16, .micro_batches = 4, .seed = 3};

// A fresh folder per call: checkpoints are never overwritten.
fs::path fresh_root(const std::string& tag) {
  const fs::path p = test::scratch_dir("checkpoint") / tag;
  fs::remove_all(p);
  return p;
}

// Epoch e's data: 6 mini-batches of 16 rows, different each epoch.
test::LabelledData epoch_data(int e) {
  return test::random_classification(96, 12, 4, 100 + e);
}

// Three epochs straight through, and the same interrupted after `stop` epochs: saved, the
// pipeline destroyed, a new one loaded from the checkpoint, the rest trained. Both weights.
template <class P, class O>
std::pair<std::vector<float>, std::vector<float>> straight_and_resumed(const std::string& sched,
                                                                       O opt, int stop,
                                                                       const fs::path& root) {
  ReferenceExecutor exec;
  auto run_epoch = [&](auto& pipe, int e) {
    const auto d = epoch_data(e);
    pipe.train(make_schedule(sched, 3, options.micro_batches, 6), d.epoch(), exec);
  };
  P straight(opt, options);
  for (int e = 0; e < 3; ++e) run_epoch(straight, e);
  {
    P first(opt, options);
    for (int e = 0; e < stop; ++e) run_epoch(first, e);
    save_checkpoint(first, root, "ckpt-" + std::to_string(stop), {{"epoch", std::to_string(stop)}});
  }
  P resumed(opt, options);
  const auto fields =
      load_checkpoint(resumed, read_checkpoint(root / ("ckpt-" + std::to_string(stop))));
  REQUIRE(fields.at("epoch") == std::to_string(stop));
  for (int e = stop; e < 3; ++e) run_epoch(resumed, e);
  return {straight.weights(), resumed.weights()};
}
}  // namespace

TEST_CASE("Resume is exact: bitwise equal weights for every schedule x predictor",
          "[checkpoint][oracle]") {
  int n = 0;
  auto check = [&]<class P, class O>(const char* sched, O opt) {
    for (int stop : {1, 2}) {
      INFO(sched << " x " << P::name << ", stopped after epoch " << stop);
      const auto [straight, resumed] = straight_and_resumed<Pipeline<S0, S1, S2, P, O>>(
          sched, opt, stop, fresh_root("exact-" + std::to_string(n++)));
      REQUIRE(straight == resumed);
    }
  };
  for (const char* sched : schedule_names) {
    check.operator()<Latest>(sched, Adam{.lr = 1e-2f});
    check.operator()<Stash>(sched, Adam{.lr = 1e-2f});
    check.operator()<DoubleBuffered>(sched, Adam{.lr = 1e-2f});
    check.operator()<XPipe>(sched, AdamW{.lr = 1e-2f});
    check.operator()<SpecTrain>(sched, SGD{.lr = 0.05f, .momentum = 0.9f});
    check.operator()<PipeOptim>(sched, Adam{.lr = 1e-2f});
  }
}

TEST_CASE("Resume restores moments and step counts - not only weights", "[checkpoint]") {
  // Weights alone would not do: a pipeline given only the weights trains differently.
  using P = Pipeline<S0, S1, S2, XPipe, Adam>;
  const fs::path root = fresh_root("moments");
  ReferenceExecutor exec;
  const auto d0 = epoch_data(0), d1 = epoch_data(1);
  P a(Adam{.lr = 1e-2f}, options);
  a.train(async_1f1b(3, 4, 6), d0.epoch(), exec);
  save_checkpoint(a, root, "ckpt-1");
  a.train(async_1f1b(3, 4, 6), d1.epoch(), exec);

  P weights_only(Adam{.lr = 1e-2f}, options);
  const auto c = read_checkpoint(root / "ckpt-1");
  P loaded(Adam{.lr = 1e-2f}, options);
  load_checkpoint(loaded, c);
  weights_only.for_each_optimizer_state([&](int k, auto& st) {
    loaded.for_each_optimizer_state([&](int j, const auto& src) {
      if (j == k) std::copy(src.weights(), src.weights() + src.size(), st.weights());
    });
  });
  REQUIRE(weights_only.weights() == loaded.weights());
  loaded.for_each_optimizer_state([](int, const auto& st) { REQUIRE(st.steps_taken() == 6); });
  REQUIRE(loaded.weight_copies(2) == 0);  // nothing trained yet: no run to report (and no crash)
  loaded.train(async_1f1b(3, 4, 6), d1.epoch(), exec);
  weights_only.train(async_1f1b(3, 4, 6), d1.epoch(), exec);
  REQUIRE(loaded.weights() == a.weights());
  REQUIRE(weights_only.weights() != a.weights());
}

TEST_CASE("Damaged checkpoints are refused naming the file and the field", "[checkpoint]") {
  using P = Pipeline<S0, S1, S2, Stash, Adam>;
  const fs::path root = fresh_root("damaged");
  P pipe(Adam{}, options);
  const fs::path good = save_checkpoint(pipe, root, "ckpt-1");
  REQUIRE(fs::exists(good / "MANIFEST"));
  REQUIRE(test::read_text(root / "latest") == "ckpt-1\n");
  REQUIRE_NOTHROW(read_checkpoint(good));

  auto damaged_copy = [&](const std::string& name) {
    const fs::path p = root / name;
    fs::remove_all(p);
    fs::copy(good, p);
    return p;
  };
  SECTION("a flipped byte") {
    const fs::path p = damaged_copy("flipped");
    std::fstream f(p / "stage-1.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(17);
    const char byte = static_cast<char>(f.get());
    f.seekp(17);
    f.put(static_cast<char>(byte ^ 0x20));
    f.close();
    REQUIRE_THROWS_WITH(read_checkpoint(p), Contains("stage-1.bin") && Contains("checksum"));
  }
  SECTION("a truncated file") {
    const fs::path p = damaged_copy("truncated");
    fs::resize_file(p / "stage-2.bin", 40);
    REQUIRE_THROWS_WITH(read_checkpoint(p), Contains("stage-2.bin") && Contains("truncated"));
  }
  SECTION("a missing file, a missing or foreign MANIFEST") {
    fs::path p = damaged_copy("missing");
    fs::remove(p / "stage-0.bin");
    REQUIRE_THROWS_WITH(read_checkpoint(p), Contains("stage-0.bin") && Contains("missing"));
    p = damaged_copy("no-manifest");
    fs::remove(p / "MANIFEST");
    REQUIRE_THROWS_WITH(read_checkpoint(p), Contains("MANIFEST") && Contains("missing"));
    p = damaged_copy("version");
    std::string m = test::read_text(p / "MANIFEST");
    m.replace(m.find("version=1"), 9, "version=7");
    std::ofstream(p / "MANIFEST") << m;
    REQUIRE_THROWS_WITH(read_checkpoint(p), Contains("version=7") && Contains("line 1"));
    std::ofstream(p / "MANIFEST") << "PK\x03\x04 not a manifest\n";
    REQUIRE_THROWS_AS(read_checkpoint(p), CheckpointError);
  }
  SECTION("another pipeline's checkpoint") {
    Pipeline<S0, S1, S2, Stash, Adam> other_m(Adam{}, {.batch = 16, .micro_batches = 2, .seed = 3});
    REQUIRE_THROWS_WITH(load_checkpoint(other_m, read_checkpoint(good)),
                        Contains("'pipeline.micro_batches' is '4'") && Contains("has '2'"));
    Pipeline<S0, S1, S2, XPipe, Adam> other_p(Adam{}, options);
    REQUIRE_THROWS_WITH(load_checkpoint(other_p, read_checkpoint(good)),
                        Contains("'pipeline.predictor' is 'stash'"));
    Pipeline<S0, S1, S2, Stash, SGD> other_o(SGD{}, options);
    REQUIRE_THROWS_WITH(load_checkpoint(other_o, read_checkpoint(good)),
                        Contains("'pipeline.optimizer' is 'adam'"));
    Pipeline<S0, Stage<Linear<16, 4>>, Stash, Adam> other_k(Adam{}, options);
    REQUIRE_THROWS_WITH(load_checkpoint(other_k, read_checkpoint(good)),
                        Contains("'pipeline.stages' is '3'"));
  }
}

TEST_CASE("The newest checkpoint that verifies is chosen - a crashed write is passed over",
          "[checkpoint]") {
  using P = Pipeline<S0, S1, S2, Latest, Adam>;
  const fs::path root = fresh_root("latest");
  REQUIRE_FALSE(find_latest_checkpoint(root).has_value());  // nothing there yet
  // Only a write killed before its first MANIFEST: start afresh, not an error.
  fs::create_directories(root / "ckpt-1");
  std::ofstream(root / "ckpt-1" / "stage-0.bin.tmp") << "partial";
  REQUIRE_FALSE(find_latest_checkpoint(root).has_value());
  P pipe(Adam{.lr = 1e-2f}, options);
  ReferenceExecutor exec;
  for (int e = 1; e <= 3; ++e) {
    const auto d = epoch_data(e);
    pipe.train(gpipe(3, 4, 6), d.epoch(), exec);
    save_checkpoint(pipe, root, "ckpt-" + std::to_string(e), {{"epoch", std::to_string(e)}});
  }
  auto choice = find_latest_checkpoint(root);
  REQUIRE(choice.has_value());
  REQUIRE(choice->contents.field("epoch") == "3");
  REQUIRE(choice->skipped.empty());
  // A write killed before its MANIFEST (only files), and one whose file was damaged later.
  fs::create_directories(root / "ckpt-5");
  std::ofstream(root / "ckpt-5" / "stage-0.bin") << "partial";
  fs::resize_file(root / "ckpt-3" / "stage-0.bin", 8);
  choice = find_latest_checkpoint(root);
  REQUIRE(choice.has_value());
  REQUIRE(choice->contents.field("epoch") == "2");
  REQUIRE(choice->skipped.size() == 2);
  CHECK_THAT(choice->skipped[0], Contains("ckpt-5") && Contains("uncommitted"));
  CHECK_THAT(choice->skipped[1], Contains("ckpt-3") && Contains("truncated"));
  // An uncommitted folder may be written again; a committed one is never overwritten.
  REQUIRE_NOTHROW(save_checkpoint(pipe, root, "ckpt-5"));
  REQUIRE_THROWS_WITH(save_checkpoint(pipe, root, "ckpt-5"), Contains("already holds"));
  // Nothing verifies: an error, not a silent fresh start.
  for (int e : {1, 2, 5}) fs::resize_file(root / ("ckpt-" + std::to_string(e)) / "stage-1.bin", 3);
  REQUIRE_THROWS_WITH(find_latest_checkpoint(root),
                      Contains("no checkpoint") && Contains("verifies"));
}

TEST_CASE("A failed checkpoint write is an error naming the path", "[checkpoint]") {
  using P = Pipeline<S0, S1, S2, Latest, Adam>;
  P pipe(Adam{}, options);
  const fs::path root = fresh_root("blocked");
  fs::create_directories(root);
  std::ofstream(root / "file") << "in the way";
  REQUIRE_THROWS_WITH(save_checkpoint(pipe, root / "file", "ckpt-1"),
                      Contains((root / "file").string()));
  REQUIRE_THROWS_WITH(save_checkpoint(pipe, root, "../escape"), Contains("bad name"));
  REQUIRE_THROWS_WITH(save_checkpoint(pipe, root, "ckpt-1", {{"pipeline.seed", "9"}}),
                      Contains("the 'pipeline.' names are the library's"));
  REQUIRE_THROWS_WITH(save_checkpoint(pipe, root, "ckpt-2", {{"note", "two\nlines"}}),
                      Contains("bad field 'note'"));
  REQUIRE_THROWS_WITH(save_checkpoint(pipe, root, "ckpt-3", {}, {{"stage-0.bin", "x"}}),
                      Contains("the 'stage-' names are the library's"));
}

TEST_CASE("A caller's own files travel with the checkpoint, verified like the state",
          "[checkpoint]") {
  using P = Pipeline<S0, S1, S2, Latest, Adam>;
  P pipe(Adam{}, options);
  const fs::path root = fresh_root("own-files");
  const std::string records = "epoch,loss\n1,0.5\n2,0.25\n";
  save_checkpoint(pipe, root, "ckpt-2", {{"epoch", "2"}}, {{"records.csv", records}});
  const auto c = read_checkpoint(root / "ckpt-2");
  REQUIRE(std::string(c.file("records.csv").begin(), c.file("records.csv").end()) == records);
  REQUIRE_THROWS_WITH(c.file("notes.txt"), Contains("'notes.txt' is not in its MANIFEST"));
  std::ofstream(root / "ckpt-2" / "records.csv") << "epoch,loss\n1,0.5\n2,0.24\n";
  REQUIRE_THROWS_WITH(read_checkpoint(root / "ckpt-2"),
                      Contains("records.csv") && Contains("checksum"));
}
