// A command's files: outputs staged and committed as one unit, refused when they are not regular
// files or are inputs; reads that never block on a FIFO; checkpoint folders that are lopper's own.
#include "lopper/files.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "lopper/error.h"
#include "lopper/onnx_io.h"
#include "lopper/train.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace lopper {
namespace {

using test::error_of;
using test::TempDir;

bool is_usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError&) {
    return true;
  } catch (...) {
  }
  return false;
}

// The external-data save options, and the MLP fixture saved with them as `name` in `d`.
onnx::SaveOptions external_data() {
  onnx::SaveOptions so;
  so.external_data = true;
  return so;
}
void save_mlp_with_external_data(const TempDir& d, const std::string& name) {
  onnx::save_model(onnx::load_model(test::fixture("mlp.ts.onnx")), d / name, external_data());
}

size_t entries(const fs::path& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.exists() || e.is_symlink();
  return n;
}

TEST(OutputFiles, CommitWritesEverythingAndLeavesNoTemporary) {
  TempDir d;
  {
    OutputFiles f("test");
    f.declare(d / "a.json", "-o");
    f.write(d / "a.json", "{}\n");
    f.write(d / "b.html", "<html>");
    EXPECT_FALSE(fs::exists(d / "a.json"));  // staged, not yet in place
    EXPECT_EQ(f.staged_bytes(d / "a.json"), 3);
    f.commit();
  }
  EXPECT_EQ(test::slurp(d / "a.json"), "{}\n");
  EXPECT_EQ(test::slurp(d / "b.html"), "<html>");
  EXPECT_EQ(entries(d.path), 2u);
}

TEST(OutputFiles, AFailedCommandLeavesNothing) {
  TempDir d;
  { std::ofstream(d / "old.onnx") << "the user's"; }
  try {
    OutputFiles f("test");
    f.write(d / "old.onnx", "new");
    f.write(d / "report.json", "{}");
    f.folder(d / "made", "--out");
    f.write(d / "made/x.npy", "x");
    throw Error("[test] the command failed after writing");
  } catch (const Error&) {
  }
  EXPECT_EQ(test::slurp(d / "old.onnx"), "the user's");  // untouched
  EXPECT_FALSE(fs::exists(d / "report.json"));
  EXPECT_FALSE(fs::exists(d / "made"));  // the folder it made goes too
  EXPECT_EQ(entries(d.path), 1u);        // no temporary
}

TEST(OutputFiles, RefusesWhatIsNotARegularFile) {
  TempDir d;
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0644), 0);
  fs::create_directory(d.path / "dir");
  fs::create_symlink("/dev/null", d.path / "null");
  for (const char* name : {"fifo", "dir", "null"}) {
    OutputFiles f("prune");
    EXPECT_TRUE(is_usage_error([&] { f.declare(d / name, "-o"); })) << name;
  }
  OutputFiles f("prune");
  EXPECT_NE(error_of([&] { f.declare(d / "fifo", "-o"); }).find("is a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { f.declare(d / "null", "-o"); }).find("symbolic link"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.declare(d / "no/x.onnx", "-o"); }).find("no folder"),
            std::string::npos);
  // write_file_atomic, which every library writer uses, refuses the same.
  EXPECT_THROW(write_file_atomic(d / "fifo", "x"), Error);
  struct stat st {};
  ASSERT_EQ(::lstat((d / "fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST(OutputFiles, RefusesAnInputUnderAnyName) {
  TempDir d;
  { std::ofstream(d / "model.onnx") << "model"; }
  fs::create_hard_link(d.path / "model.onnx", d.path / "alias.onnx");
  {
    OutputFiles f("prune");
    f.input(d / "model.onnx");
    const std::string e = error_of([&] { f.declare(d / "alias.onnx", "-o"); });
    EXPECT_NE(e.find("names an input"), std::string::npos) << e;
  }
  {
    // An input named after the output was declared (a model's external data, known once it is
    // read) is caught too.
    OutputFiles f("convert");
    f.declare(d / "alias.onnx", "-o");
    EXPECT_TRUE(is_usage_error([&] { f.input(d / "model.onnx"); }));
  }
  {
    OutputFiles f("prune");
    f.declare(d / "r.json", "-o");
    const std::string e = error_of([&] { f.declare(d / "./r.json", "--report"); });
    EXPECT_NE(e.find("another output"), std::string::npos) << e;
  }
  EXPECT_EQ(test::slurp(d / "model.onnx"), "model");
}

TEST(OutputFiles, AnOutputTurnedIntoAFifoWhileWorkingIsNotReplaced) {
  TempDir d;
  OutputFiles f("prune");
  f.write(d / "out.onnx", "model");
  ASSERT_EQ(::mkfifo((d / "out.onnx").c_str(), 0644), 0);
  EXPECT_THROW(f.commit(), UsageError);
  struct stat st {};
  ASSERT_EQ(::lstat((d / "out.onnx").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(Files, ReadsRefuseFifosWithoutBlocking) {
  TempDir d;
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0644), 0);
  // Each would block forever in open() if it opened the FIFO for reading without O_NONBLOCK.
  EXPECT_NE(error_of([&] { read_file(d / "fifo"); }).find("is a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { onnx::load_model(d / "fifo"); }).find("is a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { read_file(d.path.string()); }).find("is a folder"), std::string::npos);
}

TEST(Files, ExternalDataThatIsAFifoIsRefusedWithoutBlocking) {
  TempDir d;
  save_mlp_with_external_data(d, "m.onnx");
  ir::Model back = onnx::load_model(d / "m.onnx");
  ASSERT_EQ(back.external_files.size(), 1u);  // what the model reads is known to its commands
  EXPECT_EQ(fs::path(back.external_files[0]).filename(), "m.onnx.data");
  fs::remove(d.path / "m.onnx.data");
  ASSERT_EQ(::mkfifo((d / "m.onnx.data").c_str(), 0644), 0);
  const std::string e = error_of([&] { onnx::load_model(d / "m.onnx"); });
  EXPECT_NE(e.find("is a FIFO"), std::string::npos) << e;
}

TEST(Files, SavingAModelOverTheDataAnInputReadsIsRefused) {
  TempDir d;
  save_mlp_with_external_data(d, "a.onnx");
  fs::copy_file(d.path / "a.onnx", d.path / "b.onnx");  // b reads a.onnx.data
  const std::string before = test::slurp(d / "a.onnx.data");
  ir::Model b = onnx::load_model(d / "b.onnx");
  OutputFiles f("convert");
  f.input(d / "b.onnx");
  for (const auto& x : b.external_files) f.input(x);
  EXPECT_THROW(onnx::save_model(b, d / "a.onnx", external_data(), f), UsageError);
  EXPECT_EQ(test::slurp(d / "a.onnx.data"), before);
}

TEST(Files, RemoveTreeRemovesEverythingBelowAndFollowsNoLink) {
  TempDir d, outside;
  fs::create_directories(d.path / "t/a/b");
  std::ofstream(d / "t/a/b/f") << "x";
  std::ofstream(d / "t/g") << "y";
  std::ofstream(outside / "keep") << "z";
  fs::create_directory_symlink(outside.path, d.path / "t/a/link");
  std::error_code ec;
  remove_tree(d / "t", ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(d.path / "t"));
  EXPECT_TRUE(fs::exists(outside.path / "keep"));  // the link went, not what it pointed to
  remove_tree(d / "missing", ec);
  EXPECT_FALSE(ec) << "a missing path is not an error";
  std::ofstream(d / "file") << "x";
  remove_tree(d / "file", ec);
  EXPECT_FALSE(ec);
  EXPECT_FALSE(fs::exists(d.path / "file"));
  if (::geteuid() != 0) {  // root may remove from a folder without write permission
    fs::create_directories(d.path / "ro/x");
    fs::permissions(d.path / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    remove_tree(d / "ro", ec);
    EXPECT_TRUE(ec) << "a failure is reported";
    fs::permissions(d.path / "ro", fs::perms::owner_all);
  }
}

TEST(Checkpoints, AFolderLopperDidNotMakeIsNeverReplaced) {
  TempDir d;
  fs::create_directory(d.path / "mine");
  { std::ofstream(d / "mine/notes.txt") << "keep me"; }
  { std::ofstream(d / "file") << "a file"; }
  EXPECT_THROW(check_checkpoint_dir(d / "mine"), UsageError);
  EXPECT_THROW(check_checkpoint_dir(d / "file"), UsageError);
  EXPECT_THROW(check_checkpoint_dir(d.path.string()), UsageError);  // the folder we stand in
  EXPECT_THROW(check_checkpoint_dir(d / "no/such/ck"), UsageError);
  EXPECT_NO_THROW(check_checkpoint_dir(d / "new"));  // made when the first checkpoint is written
  fs::create_directory(d.path / "empty");
  EXPECT_NO_THROW(check_checkpoint_dir(d / "empty"));
  { std::ofstream(d / "mine/.lopper-checkpoint") << "lopper's"; }
  EXPECT_NO_THROW(check_checkpoint_dir(d / "mine"));
  EXPECT_EQ(test::slurp(d / "mine/notes.txt"), "keep me");
}

TEST(Checkpoints, ResumeReadsTheNewestCheckpointOfAFolder) {
  TempDir d;
  fs::create_directories(d.path / "ck/epoch-3");
  { std::ofstream(d / "ck/latest") << "epoch-3\n"; }
  EXPECT_EQ(checkpoint_to_resume(d / "ck"), d / "ck/epoch-3");
  EXPECT_EQ(checkpoint_to_resume(d / "ck/epoch-3"), d / "ck/epoch-3");
  { std::ofstream(d / "ck/latest") << "../../etc\n"; }
  EXPECT_THROW(checkpoint_to_resume(d / "ck"), Error);
}

}  // namespace
}  // namespace lopper
