// Checkpoints: resume is exact (bitwise, every schedule x predictor), and every damaged,
// foreign or mismatched checkpoint is refused with the file and field named.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
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
// `more`: the pipeline's constructor arguments after the options (an AnyPredictor's choice).
template <class P, class O, class... More>
std::pair<std::vector<float>, std::vector<float>> straight_and_resumed(const std::string& sched,
                                                                       O opt, int stop,
                                                                       const fs::path& root,
                                                                       const More&... more) {
  ReferenceExecutor exec;
  auto run_epoch = [&](auto& pipe, int e) {
    const auto d = epoch_data(e);
    pipe.train(make_schedule(sched, 3, options.micro_batches, 6, test::uneven_costs(3)), d.epoch(),
               exec);
  };
  P straight(opt, options, more...);
  for (int e = 0; e < 3; ++e) run_epoch(straight, e);
  {
    P first(opt, options, more...);
    for (int e = 0; e < stop; ++e) run_epoch(first, e);
    save_checkpoint(first, root, "ckpt-" + std::to_string(stop), {{"epoch", std::to_string(stop)}});
  }
  P resumed(opt, options, more...);
  const auto fields =
      load_checkpoint(resumed, read_checkpoint(root / ("ckpt-" + std::to_string(stop))));
  REQUIRE(fields.at("epoch") == std::to_string(stop));
  for (int e = stop; e < 3; ++e) run_epoch(resumed, e);
  return {straight.weights(), resumed.weights()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

void flip_byte(const fs::path& p, std::streamoff at, char mask) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  const char byte = static_cast<char>(f.get());
  f.seekp(at);
  f.put(static_cast<char>(byte ^ mask));
}

// Every file of a folder and its bytes: what a set-aside checkpoint must keep.
std::map<std::string, std::string> folder_bytes(const fs::path& folder) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(folder))
    out[e.path().filename().string()] = test::read_text(e.path());
  return out;
}

// A version-2 MANIFEST's last line for `text`, computed with zlib here, not by the library.
std::string crc_line(const std::string& text) {
  char hex[16];
  std::snprintf(
      hex, sizeof hex, "%08lx",
      crc32(0L, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
  return std::string("manifest-crc32 ") + hex + "\n";
}

// Edits a checkpoint's MANIFEST text. With `reseal` its checksum line is redone, as a careful
// forger would: what is left to catch the edit is its meaning.
void edit_manifest(const fs::path& folder, const std::function<void(std::string&)>& edit,
                   bool reseal) {
  std::string m = test::read_text(folder / "MANIFEST");
  if (reseal) m.erase(m.rfind("manifest-crc32 "));
  edit(m);
  if (reseal) m += crc_line(m);
  write_bytes(folder / "MANIFEST", m);
}

// Sets field `key` of a MANIFEST's text to `value`.
void set_value(std::string& m, const std::string& key, const std::string& value) {
  const std::size_t at = m.find("field " + key + " ") + key.size() + 7;
  m.replace(at, m.find('\n', at) - at, value);
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
    // Two stages per worker need an even K >= 4; these pipelines have 3 stages.
    if (stages_per_worker(sched) > 1) continue;
    check.operator()<Latest>(sched, Adam{.lr = 1e-2f});
    check.operator()<Stash>(sched, Adam{.lr = 1e-2f});
    check.operator()<DoubleBuffered>(sched, Adam{.lr = 1e-2f});
    check.operator()<XPipe>(sched, AdamW{.lr = 1e-2f});
    check.operator()<SpecTrain>(sched, SGD{.lr = 0.05f, .momentum = 0.9f});
    check.operator()<PipeOptim>(sched, Adam{.lr = 1e-2f});
  }
}

TEST_CASE("Resume is exact for every predictor by name, NAdam's momentum schedule included",
          "[checkpoint][oracle]") {
  // Each predictor on the schedule the study runs it on (the 2BW remedies on 2bw, the others on
  // async 1F1B), chosen at run time; PipeNAG also with PyTorch's momentum decay.
  int n = 0;
  auto check = [&](const AnyPredictor& chosen, const std::string& label) {
    const std::string name = chosen.chosen_name();
    const char* sched = name.rfind("2bw", 0) == 0 ? "2bw" : "async-1f1b";
    for (int stop : {1, 2}) {
      INFO(label << " on " << sched << ", stopped after epoch " << stop);
      const auto [straight, resumed] =
          straight_and_resumed<Pipeline<S0, S1, S2, AnyPredictor, Adam>>(
              sched, Adam{.lr = 1e-2f}, stop, fresh_root("any-" + std::to_string(n++)), chosen);
      REQUIRE(straight == resumed);
    }
  };
  for (const auto& name : predictor_names) check(make_predictor(name), name);
  AnyPredictor psi = make_predictor("pipenag");
  psi.set("momentum_decay", 0.004);
  check(psi, "pipenag, momentum_decay 0.004");
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
    m.replace(m.find("version=2"), 9, "version=7");
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
  REQUIRE(choice->refused == std::vector<fs::path>{root / "ckpt-3"});  // committed, not verified
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

TEST_CASE("A version-2 MANIFEST ends with the CRC-32 of its own text", "[checkpoint]") {
  const fs::path root = fresh_root("format-2");
  CheckpointWriter w(root, "ckpt-7");
  w.add_file("a.txt", std::string("hello"));
  w.set_field("epoch", "3");
  w.set_field("note", " two spaces");  // a value's own leading space survives the round trip
  w.commit();
  // The CRC-32 values are Python's zlib.crc32 of "hello" and of the four lines before the last.
  const std::string lines =
      "xpipe-checkpoint version=2\n"
      "file a.txt bytes=5 crc32=3610a686\n"
      "field epoch 3\n"
      "field note  two spaces\n";
  const std::string manifest = lines + "manifest-crc32 ba555e54\n";
  REQUIRE(test::read_text(root / "ckpt-7" / "MANIFEST") == manifest);
  REQUIRE(checkpoint_format_version == 2);
  const auto c = read_checkpoint(root / "ckpt-7");
  REQUIRE(c.field("note") == " two spaces");
  REQUIRE(std::string(c.file("a.txt").begin(), c.file("a.txt").end()) == "hello");

  const auto m = parse_checkpoint_manifest(manifest, "here/MANIFEST");
  REQUIRE(m.fields.at("epoch") == "3");
  REQUIRE(m.files.size() == 1);
  REQUIRE(m.files[0].crc32 == 0x3610a686u);
  // The checksum line last, once, whole, and ended by one LF.
  REQUIRE_THROWS_WITH(parse_checkpoint_manifest(manifest + "field late 1\n", "here/MANIFEST"),
                      Contains("here/MANIFEST, line 6") && Contains("'manifest-crc32"));
  REQUIRE_THROWS_WITH(parse_checkpoint_manifest(manifest + crc_line(manifest), "here/MANIFEST"),
                      Contains("line 5") && Contains("before the last"));
  REQUIRE_THROWS_WITH(parse_checkpoint_manifest(manifest.substr(0, manifest.size() - 1), "h"),
                      Contains("line 5") && Contains("newline"));
  REQUIRE_THROWS_WITH(parse_checkpoint_manifest(lines + "manifest-crc32 BA555E54\n", "h"),
                      Contains("line 5") && Contains("8 hex digits"));
  REQUIRE_THROWS_WITH(parse_checkpoint_manifest(lines + "manifest-crc32 ba555e55\n", "h"),
                      Contains("does not match its own checksum"));
}

TEST_CASE("Every kind of damage to a committed checkpoint is refused, passed over and set aside",
          "[checkpoint]") {
  using P = Pipeline<S0, S1, S2, Latest, Adam>;
  P pipe(Adam{}, options);
  auto fields = [](int e) -> std::map<std::string, std::string> {
    return {{"epoch", std::to_string(e)}, {"result.copies", "3"}, {"result.kib", "1.5"}};
  };
  const std::map<std::string, std::string> files{{"records.csv", "epoch,loss\n1,0.5\n"}};
  auto read = [](const fs::path& p) { read_checkpoint(p); };
  auto edit = [](bool reseal, const std::function<void(std::string&)>& change) {
    return [=](const fs::path& p) { edit_manifest(p, change, reseal); };
  };
  struct Damage {
    const char* what;
    std::function<void(const fs::path&)> damage;
    std::string names;  // file or field the refusal must name, under the folder
    std::string says;
    bool verifies = false;  // the MANIFEST is sound: the reader of the field refuses it
    std::function<void(const fs::path&)> reader = nullptr;  // read_checkpoint when null
  };
  const std::vector<Damage> damages{
      {"a truncated data file", [](const fs::path& p) { fs::resize_file(p / "stage-2.bin", 40); },
       "stage-2.bin", "truncated"},
      {"a flipped byte in a data file",
       [](const fs::path& p) { flip_byte(p / "stage-1.bin", 17, 0x20); }, "stage-1.bin",
       "does not match its MANIFEST checksum"},
      {"a flipped bit in a field value of the MANIFEST",  // "3" becomes "2"
       [](const fs::path& p) {
         const std::string m = test::read_text(p / "MANIFEST");
         flip_byte(p / "MANIFEST", static_cast<std::streamoff>(m.find("result.copies 3") + 14), 1);
       },
       "MANIFEST", "does not match its own checksum"},
      {"a file's crc changed in the MANIFEST",
       edit(false, [](std::string& m) { m[m.find("crc32=", m.find("stage-0.bin")) + 6] ^= 1; }),
       "MANIFEST", "does not match its own checksum"},
      {"a file's crc changed in the MANIFEST, its own checksum redone",
       edit(true, [](std::string& m) { m[m.find("crc32=", m.find("stage-0.bin")) + 6] ^= 1; }),
       "stage-0.bin", "does not match its MANIFEST checksum"},
      {"the version changed",
       edit(true, [](std::string& m) { m.replace(m.find("version=2"), 9, "version=3"); }),
       "MANIFEST", "line 1: format 'version=3', this library reads version=1, version=2"},
      {"CRLF line ends",
       [](const fs::path& p) {
         std::string crlf;
         for (char ch : test::read_text(p / "MANIFEST"))
           crlf += ch == '\n' ? "\r\n" : std::string(1, ch);
         write_bytes(p / "MANIFEST", crlf);
       },
       "MANIFEST", "CRLF"},
      {"the checksum line removed",
       edit(false, [](std::string& m) { m.erase(m.rfind("manifest-crc32 ")); }), "MANIFEST",
       "no 'manifest-crc32 <8 hex digits>' line at its end"},
      {"a listed file deleted", [](const fs::path& p) { fs::remove(p / "records.csv"); },
       "records.csv", "missing"},
      {"a non-numeric field",
       edit(true, [](std::string& m) { set_value(m, "result.copies", "x"); }), "MANIFEST",
       "field 'result.copies' is 'x', not a whole number in [0, 1000]", true,
       [](const fs::path& p) { read_checkpoint(p).field_integer("result.copies", 0, 1000); }},
      {"an overflowing field",
       edit(true, [](std::string& m) { set_value(m, "result.copies", "99999999999999999999"); }),
       "MANIFEST", "field 'result.copies' is '99999999999999999999', not a whole number", true,
       [](const fs::path& p) { read_checkpoint(p).field_integer("result.copies", 0, LLONG_MAX); }},
      {"a field beyond a double's range",
       edit(true, [](std::string& m) { set_value(m, "result.kib", "1e999"); }), "MANIFEST",
       "field 'result.kib' is '1e999', not a finite decimal number in [0, 1e+12]", true,
       [](const fs::path& p) { read_checkpoint(p).field_number("result.kib", 0, 1e12); }},
  };
  int n = 0;
  for (const Damage& d : damages) {
    INFO(d.what);
    const fs::path root = fresh_root("damage-" + std::to_string(n++));
    save_checkpoint(pipe, root, "ckpt-1", fields(1), files);
    save_checkpoint(pipe, root, "ckpt-2", fields(2), files);
    const fs::path bad = root / "ckpt-2";
    d.damage(bad);
    const auto damaged = folder_bytes(bad);
    const auto& reader = d.reader ? d.reader : read;
    REQUIRE_THROWS_AS(reader(bad), CheckpointError);
    REQUIRE_THROWS_WITH(reader(bad), Contains((bad / d.names).string()) && Contains(d.says));

    auto choice = find_latest_checkpoint(root);
    REQUIRE(choice.has_value());
    if (d.verifies) {  // a sound MANIFEST: chosen; its user refuses the field (above)
      REQUIRE(choice->contents.field("epoch") == "2");
      REQUIRE(choice->refused.empty());
    } else {
      REQUIRE(choice->contents.field("epoch") == "1");
      REQUIRE(choice->refused == std::vector<fs::path>{bad});
      REQUIRE(choice->skipped.size() == 1);
      CHECK_THAT(choice->skipped[0], Contains((bad / d.names).string()) && Contains(d.says));
    }
    // Retraining epoch 2: its name is taken until the damaged folder is set aside, bytes kept.
    REQUIRE_THROWS_WITH(save_checkpoint(pipe, root, "ckpt-2"), Contains("already holds"));
    REQUIRE(set_aside_checkpoint(bad) == root / "ckpt-2.refused");
    REQUIRE_FALSE(fs::exists(bad));
    REQUIRE(folder_bytes(root / "ckpt-2.refused") == damaged);
    REQUIRE_NOTHROW(save_checkpoint(pipe, root, "ckpt-2", fields(2), files));
    choice = find_latest_checkpoint(root);
    REQUIRE(choice->contents.field("epoch") == "2");
    REQUIRE(choice->skipped.empty());
    // Damaged again: the next free name, the first one set aside untouched.
    fs::resize_file(bad / "stage-0.bin", 1);
    REQUIRE(set_aside_checkpoint(bad) == root / "ckpt-2.refused-2");
    REQUIRE(folder_bytes(root / "ckpt-2.refused") == damaged);
    REQUIRE(find_latest_checkpoint(root)->contents.field("epoch") == "1");
  }
}

TEST_CASE("Version-1 checkpoints of the previous release still read", "[checkpoint]") {
  const fs::path root = fresh_root("version-1");
  fs::create_directories(root / "ckpt-1");
  write_bytes(root / "ckpt-1" / "a.txt", "hello");
  // As the previous release wrote it: no checksum line (3610a686 is zlib's CRC-32 of "hello").
  const std::string v1 =
      "xpipe-checkpoint version=1\n"
      "file a.txt bytes=5 crc32=3610a686\n"
      "field epoch 3\n";
  write_bytes(root / "ckpt-1" / "MANIFEST", v1);
  const auto c = read_checkpoint(root / "ckpt-1");
  REQUIRE(c.field("epoch") == "3");
  REQUIRE(std::string(c.file("a.txt").begin(), c.file("a.txt").end()) == "hello");
  const auto choice = find_latest_checkpoint(root);
  REQUIRE(choice.has_value());
  REQUIRE(choice->contents.field_integer("epoch", 1, 100) == 3);

  const std::string where = (root / "ckpt-1" / "MANIFEST").string();
  write_bytes(root / "ckpt-1" / "MANIFEST", v1 + crc_line(v1));
  REQUIRE_THROWS_WITH(read_checkpoint(root / "ckpt-1"), Contains(where + ", line 4") &&
                                                            Contains("'manifest-crc32' line") &&
                                                            Contains("version-1"));
  write_bytes(root / "ckpt-1" / "MANIFEST",
              "xpipe-checkpoint version=1\r\nfile a.txt bytes=5 crc32=3610a686\r\n");
  REQUIRE_THROWS_WITH(read_checkpoint(root / "ckpt-1"),
                      Contains(where + ", line 1") && Contains("carriage return"));
  // A version-2 header needs its checksum line.
  write_bytes(root / "ckpt-1" / "MANIFEST", "xpipe-checkpoint version=2\n" + v1.substr(27));
  REQUIRE_THROWS_WITH(read_checkpoint(root / "ckpt-1"),
                      Contains(where + ", line 3") && Contains("manifest-crc32"));
}

TEST_CASE("A planted .tmp symlink is replaced, never written through", "[checkpoint]") {
  using P = Pipeline<S0, S1, S2, Latest, Adam>;
  P pipe(Adam{}, options);
  const fs::path root = fresh_root("planted");
  const fs::path outside = fresh_root("planted-outside");
  fs::create_directories(root);
  fs::create_directories(outside);
  const fs::path precious = outside / "precious.txt";
  write_bytes(precious, "precious\n");
  fs::create_symlink(precious, root / "latest.tmp");
  REQUIRE_NOTHROW(save_checkpoint(pipe, root, "ckpt-1"));
  REQUIRE(test::read_text(precious) == "precious\n");
  REQUIRE(test::read_text(root / "latest") == "ckpt-1\n");
  REQUIRE(fs::is_regular_file(fs::symlink_status(root / "latest")));
  REQUIRE_FALSE(fs::exists(fs::symlink_status(root / "latest.tmp")));

  // Inside a checkpoint being written: a planted link, and a longer temporary a crash left.
  CheckpointWriter w(root, "ckpt-2");
  fs::create_symlink(precious, root / "ckpt-2" / "a.bin.tmp");
  write_bytes(root / "ckpt-2" / "b.bin.tmp", "a longer temporary left by a crash");
  w.add_file("a.bin", std::string("new a"));
  w.add_file("b.bin", std::string("new b"));
  w.commit();
  REQUIRE(test::read_text(precious) == "precious\n");
  const auto c = read_checkpoint(root / "ckpt-2");
  REQUIRE(std::string(c.file("a.bin").begin(), c.file("a.bin").end()) == "new a");
  REQUIRE(std::string(c.file("b.bin").begin(), c.file("b.bin").end()) == "new b");
}

TEST_CASE("Numbers from fields: the whole value, decimal, in range - or an error naming it",
          "[checkpoint]") {
  CheckpointContents c;
  c.folder = fs::path("ckpts") / "ckpt-7";
  const std::string where = (c.folder / "MANIFEST").string();
  auto integer = [&](const std::string& value, long long lo, long long hi) {
    c.fields["k"] = value;
    return c.field_integer("k", lo, hi);
  };
  auto number = [&](const std::string& value, double lo, double hi) {
    c.fields["k"] = value;
    return c.field_number("k", lo, hi);
  };
  REQUIRE(integer("3", 0, 10) == 3);
  REQUIRE(integer("-5", -10, 10) == -5);
  REQUIRE(integer("1000", 0, 1000) == 1000);
  REQUIRE(integer("0", 0, 0) == 0);
  REQUIRE_THROWS_WITH(integer("1001", 0, 1000),
                      Contains(where + ": field 'k' is '1001', not a whole number in [0, 1000]"));
  REQUIRE_THROWS_WITH(integer("x", 0, 1000),
                      Contains(where + ": field 'k' is 'x', not a whole number in [0, 1000]"));
  REQUIRE_THROWS_WITH(integer("99999999999", INT_MIN, INT_MAX),
                      Contains("'99999999999', not a whole number in [-2147483648, 2147483647]"));
  REQUIRE_THROWS_WITH(integer("99999999999999999999", LLONG_MIN, LLONG_MAX),
                      Contains("'99999999999999999999', not a whole number"));
  for (const char* bad : {"1e999", "0x3", " 3", "3 ", "", "+3", "3.0", "--3", "-", "3x"})
    REQUIRE_THROWS_WITH(integer(bad, 0, 1000),
                        Contains(std::string("field 'k' is '") + bad + "', not a whole number"));

  REQUIRE(number("0.25", 0, 1) == 0.25);
  REQUIRE(number("-3", -5, 5) == -3.0);
  REQUIRE(number("1e3", 0, 1e6) == 1000.0);
  REQUIRE(number("1", 0, 1) == 1.0);
  REQUIRE_THROWS_WITH(number("1e999", 0, 1e6),
                      Contains(where + ": field 'k' is '1e999', not a finite decimal number in "
                                       "[0, 1e+06]"));
  REQUIRE_THROWS_WITH(number("2", 0, 1.5),
                      Contains("'2', not a finite decimal number in [0, 1.5]"));
  for (const char* bad : {"inf", "-inf", "nan", "infinity", "0x3", " 3", "3 ", "", "+3", "x", "1e"})
    REQUIRE_THROWS_WITH(number(bad, -1e9, 1e9),
                        Contains(std::string("field 'k' is '") + bad + "', not a finite"));
  c.fields.erase("k");
  REQUIRE_THROWS_WITH(c.field_integer("k", 0, 1), Contains(where + ": field 'k' is missing"));
}

TEST_CASE("find_latest_checkpoint passes over what it cannot look at, set_aside names the path",
          "[checkpoint]") {
  using P = Pipeline<S0, S1, S2, Latest, Adam>;
  P pipe(Adam{}, options);
  const fs::path root = fresh_root("unlookable");
  save_checkpoint(pipe, root, "ckpt-1", {{"epoch", "1"}});
  fs::create_symlink("ckpt-9", root / "ckpt-9");   // a loop: its type cannot be told
  fs::create_symlink("nowhere", root / "ckpt-8");  // dangling: not a folder
  std::optional<CheckpointChoice> choice;
  REQUIRE_NOTHROW(choice = find_latest_checkpoint(root));
  REQUIRE(choice.has_value());
  REQUIRE(choice->contents.field("epoch") == "1");
  REQUIRE(choice->skipped.size() == 1);
  CHECK_THAT(choice->skipped[0],
             Contains((root / "ckpt-9").string()) && Contains("cannot tell whether"));
  REQUIRE(choice->refused.empty());
  REQUIRE_THROWS_WITH(set_aside_checkpoint(root / "ckpt-3"),
                      Contains((root / "ckpt-3").string()) && Contains("does not exist"));
  // A trailing separator names the same folder.
  REQUIRE(set_aside_checkpoint(root / "ckpt-1" / "") == root / "ckpt-1.refused");
  REQUIRE(fs::exists(root / "ckpt-1.refused" / "MANIFEST"));
  REQUIRE_FALSE(find_latest_checkpoint(root).has_value());
}
