// Tests for the node configuration parser: valid files, defaults and round
// trips, units, and one case for every kind of invalid input.
#include "daemon/config/node_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parse_helpers.h"

namespace hsdp {

// Lets gtest print configs in failure messages.
void PrintTo(const NodeConfig& config, std::ostream* os) { *os << "\n" << NodeConfigToYaml(config); }

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using ::hsdp::testing::ParseError;
using ::hsdp::testing::ParseOk;

// A config with every field away from its default.
NodeConfig NonDefaultConfig() {
  NodeConfig c;
  c.node_name = "gpu-node-17";
  c.socket_path = "/var/run/hsdp/ctl.sock";
  c.socket_mode = 0600;
  c.allowed_uids = {0, 1000, 4294967294u};
  c.engine_threads = 12;
  c.inline_max_bytes = 4096;
  c.max_session_bytes = 3ull << 30;
  c.max_node_bytes = 1000000000000ull;
  c.max_sessions = 17;
  c.max_buffers_per_session = 99;
  c.max_groups_per_job = 3;
  c.max_job_bytes = 5ull << 30;
  c.max_job_ops_in_flight = 1000000000;
  c.uid_share_percent = 100;
  c.engine_bulk_nice = 19;
  c.engine_idle_lower_classes = false;
  c.priority_classes = {PriorityClass{"interactive", 0, {"infer-*", "a\"b: [c]"}, {}},
                        PriorityClass{"batch", 7, {}, {2000, 0}}};
  c.ring_entries = 65536;
  c.spin_us = 0;
  c.spin_mode = "pause";
  c.collective_timeout_ms = 86400000;
  c.data_connect_timeout_ms = 1;
  c.shutdown_grace_ms = 0;
  c.log_level = "debug";
  return c;
}

// ---------------------------------------------------------------------------
// Valid input.

TEST(NodeConfigTest, FullFile) {
  const NodeConfig config = ParseOk(R"yaml(
# every key
node:
  name: gpu-node-17
  socket: /var/run/hsdp/ctl.sock
  socket_mode: 0600
  allowed_uids: [0, 1000, 4294967294]
engine:
  kind: cpu
  threads: 12
  inline_max_bytes: 4KiB
  bulk_nice: 19
  idle_lower_classes: false
limits:
  max_session_bytes: 3GiB
  max_node_bytes: 1TB
  max_sessions: 17
  max_buffers_per_session: 99
  max_groups_per_job: 3
  max_job_bytes: 5GiB
  max_job_ops_in_flight: 1000000000
  uid_share_percent: 100
jobs:
  priority_classes:
    - name: interactive
      level: 0
      jobs: ["infer-*", 'a"b: [c]']
    - {name: batch, level: 7, uids: [2000, 0]}
data_plane:
  ring_entries: 65536
  spin_us: 0
  spin_mode: pause
timeouts:
  collective_ms: 86400000
  data_connect_ms: 1
  shutdown_grace_ms: 0
log:
  level: debug
)yaml");
  EXPECT_EQ(config, NonDefaultConfig());
}

TEST(NodeConfigTest, PartialFileKeepsOtherDefaults) {
  const NodeConfig config = ParseOk("engine:\n  threads: 4\nlog:\n  level: error\n");
  NodeConfig expected;
  expected.engine_threads = 4;
  expected.log_level = "error";
  EXPECT_EQ(config, expected);
}

TEST(NodeConfigTest, EmptyDocumentsGiveDefaults) {
  for (const char* yaml : {"", "\n", "# only a comment\n", "---\n", "---\n...\n", "{}",
                           "engine:\n", "node: {}\nlimits:\n# nothing\n"}) {
    EXPECT_EQ(ParseOk(yaml), NodeConfig{}) << "input: " << yaml;
  }
}

TEST(NodeConfigTest, BlockListOfUids) {
  EXPECT_EQ(ParseOk("node:\n  allowed_uids:\n    - 1000\n    - 0\n").allowed_uids,
            (std::vector<uid_t>{1000, 0}));
  EXPECT_TRUE(ParseOk("node:\n  allowed_uids: []\n").allowed_uids.empty());
}

TEST(NodeConfigTest, LogLevelAliasIsCanonicalised) {
  EXPECT_EQ(ParseOk("log:\n  level: warn\n").log_level, "warning");
  EXPECT_EQ(ParseOk("log:\n  level: warning\n").log_level, "warning");
}

TEST(NodeConfigTest, SizeUnits) {
  const std::pair<const char*, uint64_t> kCases[] = {
      {"65536", 65536},
      {"\"4096\"", 4096},
      {"0", 0},
      {"512KiB", 512ull << 10},
      {"64MiB", 64ull << 20},
      {"8GiB", 8ull << 30},
      {"1TiB", 1ull << 40},
      {"5KB", 5000},
      {"2MB", 2000000},
      {"3GB", 3000000000ull},
      {"1TB", 1000000000000ull},
      {"64 MiB", 64ull << 20},
      {"16mib", 16ull << 20},
      {"\"2 GiB\"", 2ull << 30},
      {"16777215TiB", 16777215ull << 40},
      {"18446744073709551615", ~uint64_t{0}},
  };
  for (const auto& [text, bytes] : kCases) {
    EXPECT_EQ(ParseOk(std::string("limits:\n  max_node_bytes: ") + text).max_node_bytes, bytes)
        << text;
  }
  EXPECT_EQ(ParseOk("engine:\n  inline_max_bytes: 64MiB\n").inline_max_bytes, 64ull << 20);
  EXPECT_EQ(ParseOk("engine:\n  inline_max_bytes: 100B\n").inline_max_bytes, 100u);
  EXPECT_EQ(ParseOk("engine:\n  inline_max_bytes: 0KiB\n").inline_max_bytes, 0u);
  EXPECT_EQ(ParseOk("limits:\n  max_session_bytes: 4KiB\n").max_session_bytes, 4096u);
}

TEST(NodeConfigTest, OctalSocketMode) {
  const std::pair<const char*, uint32_t> kCases[] = {
      {"0660", 0660}, {"\"0660\"", 0660}, {"0600", 0600}, {"0o640", 0640},
      {"0O644", 0644}, {"0", 0},          {"0777", 0777}, {"00007", 07},
  };
  for (const auto& [text, mode] : kCases) {
    EXPECT_EQ(ParseOk(std::string("node:\n  socket_mode: ") + text).socket_mode, mode) << text;
  }
}

TEST(NodeConfigTest, EmptySocketMeansDefault) {
  EXPECT_EQ(ParseOk("node:\n  socket: \"\"\n").socket_path, "");
}

// ---------------------------------------------------------------------------
// Defaults and round trips.

TEST(NodeConfigTest, DefaultYamlParsesToDefaults) {
  EXPECT_EQ(ParseOk(DefaultNodeConfigYaml()), NodeConfig{});
}

TEST(NodeConfigTest, DefaultYamlListsEveryKeyWithAComment) {
  const std::string yaml = DefaultNodeConfigYaml();
  for (const char* key :
       {"node:", "name:", "socket:", "socket_mode: 0660", "allowed_uids: []", "engine:",
        "kind: \"cpu\"", "threads: 0", "inline_max_bytes: 64KiB", "limits:",
        "max_session_bytes: 64GiB", "max_node_bytes: 0", "max_sessions: 256",
        "max_buffers_per_session: 4096", "max_groups_per_job: 1024", "max_job_bytes: 0", "max_job_ops_in_flight: 0", "uid_share_percent: 50",
        "bulk_nice: 0", "idle_lower_classes: true", "jobs:", "priority_classes: []", "data_plane:",
        "ring_entries: 1024", "spin_us: 50", "timeouts:", "collective_ms: 60000",
        "data_connect_ms: 10000", "shutdown_grace_ms: 5000", "log:", "level: \"info\""}) {
    EXPECT_THAT(yaml, HasSubstr(key));
  }
  // Every key line carries a comment.
  std::istringstream lines(yaml);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) {
      EXPECT_THAT(line, HasSubstr("#")) << line;
    }
  }
}

TEST(NodeConfigTest, ConnectionLimitsAndHelloTimeouts) {
  const NodeConfig defaults;
  EXPECT_EQ(defaults.max_connections_per_uid, 64u);
  EXPECT_EQ(defaults.hello_timeout_ms, 5000u);
  EXPECT_EQ(defaults.idle_connection_timeout_ms, 300000u);
  EXPECT_THAT(DefaultNodeConfigYaml(),
              AllOf(HasSubstr("max_connections_per_uid: 64"), HasSubstr("hello_ms: 5000"),
                    HasSubstr("idle_connection_ms: 300000")));
  const NodeConfig c = ParseOk(
      "limits:\n  max_connections_per_uid: 1\ntimeouts:\n  hello_ms: 1\n"
      "  idle_connection_ms: 86400000\n");
  EXPECT_EQ(c.max_connections_per_uid, 1u);
  EXPECT_EQ(c.hello_timeout_ms, 1u);
  EXPECT_EQ(c.idle_connection_timeout_ms, 86400000u);
  EXPECT_EQ(ParseOk(NodeConfigToYaml(c)), c);
}

TEST(NodeConfigTest, ToYamlRoundTripsDefaults) {
  EXPECT_EQ(ParseOk(NodeConfigToYaml(NodeConfig{})), NodeConfig{});
}

TEST(NodeConfigTest, ToYamlRoundTripsNonDefaultConfig) {
  const NodeConfig config = NonDefaultConfig();
  EXPECT_EQ(ParseOk(NodeConfigToYaml(config)), config) << NodeConfigToYaml(config);
}

TEST(NodeConfigTest, ToYamlRoundTripsAwkwardValues) {
  NodeConfig config;
  config.node_name = "n\"ode\\#1: [x] — ü";
  config.socket_path = "/tmp/a b\tc'#.sock";
  config.socket_mode = 0;
  config.inline_max_bytes = 0;
  config.max_session_bytes = 4097;      // not a whole unit
  config.max_node_bytes = ~uint64_t{0};  // the largest size
  config.engine_threads = 1024;
  config.ring_entries = 16;
  EXPECT_EQ(ParseOk(NodeConfigToYaml(config)), config) << NodeConfigToYaml(config);
}

TEST(NodeConfigTest, PriorityClassesParseInOrder) {
  const NodeConfig c = ParseOk(
      "jobs:\n"
      "  priority_classes:\n"
      "    - {name: interactive, level: 1, jobs: [\"infer-*\", \"eval-?\"]}\n"
      "    - name: batch\n"
      "      level: 6\n"
      "      uids: [2000, 2001]\n");
  ASSERT_EQ(c.priority_classes.size(), 2u);
  EXPECT_EQ(c.priority_classes[0],
            (PriorityClass{"interactive", 1, {"infer-*", "eval-?"}, {}}));
  EXPECT_EQ(c.priority_classes[1], (PriorityClass{"batch", 6, {}, {2000, 2001}}));
  EXPECT_TRUE(ParseOk("jobs: {priority_classes: []}\n").priority_classes.empty());
}

TEST(NodeConfigTest, PriorityClassErrorsNameTheEntryAndLine) {
  auto error = [](const std::string& classes) {
    return ParseError("jobs:\n  priority_classes:\n" + classes);
  };
  EXPECT_THAT(error("    - {name: a, level: 8}\n"),
              AllOf(HasSubstr("test.yaml:3: jobs.priority_classes[0].level"), HasSubstr("8")));
  EXPECT_THAT(error("    - {name: a}\n"), HasSubstr("a class needs a level"));
  EXPECT_THAT(error("    - {level: 1}\n"), HasSubstr("a class needs a name"));
  EXPECT_THAT(error("    - {name: A!, level: 1}\n"), HasSubstr("is not 1 to 32 bytes"));
  EXPECT_THAT(error("    - {name: a, level: 1, job: [x]}\n"),
              AllOf(HasSubstr("jobs.priority_classes[0].job"), HasSubstr("unknown key")));
  EXPECT_THAT(error("    - {name: a, level: 1}\n    - {name: a, level: 2}\n"),
              AllOf(HasSubstr("test.yaml:4: jobs.priority_classes[1]"),
                    HasSubstr("listed twice")));
  EXPECT_THAT(error("    - {name: a, level: 1, jobs: \"x*\"}\n"),
              HasSubstr("expected a list of job name patterns"));
  EXPECT_THAT(error("    - {name: a, level: 1, jobs: [\"\"]}\n"), HasSubstr("1 to 128 bytes"));
  EXPECT_THAT(error("    - {name: a, level: 1, uids: [-1]}\n"),
              HasSubstr("jobs.priority_classes[0].uids[0]"));
  EXPECT_THAT(ParseError("jobs: {priority_classes: {name: a}}\n"),
              HasSubstr("expected a list of classes"));
  std::string many;
  for (int i = 0; i <= 64; ++i) many += "    - {name: c" + std::to_string(i) + ", level: 1}\n";
  EXPECT_THAT(error(many), HasSubstr("65 classes; at most 64"));
}

TEST(NodeConfigTest, Summary) {
  EXPECT_EQ(NodeConfigSummary(NodeConfig{}),
            "engine=cpu threads=auto ring_entries=1024 spin_us=50 collective_timeout_ms=60000 "
            "max_sessions=256 max_session_bytes=64GiB max_node_bytes=auto log_level=info");
  EXPECT_THAT(NodeConfigSummary(NonDefaultConfig()),
              AllOf(HasSubstr("threads=12"), HasSubstr("max_session_bytes=3GiB"),
                    HasSubstr("max_node_bytes=1TB")));
}

// ---------------------------------------------------------------------------
// Invalid input: every case must name the key path, the bad value and the line.

struct InvalidCase {
  const char* name;
  const char* yaml;
  const char* path;   // key path (or other text) the message must name
  const char* value;  // the offending value as the message shows it
  int line;
};

void PrintTo(const InvalidCase& c, std::ostream* os) { *os << c.name; }

class InvalidConfigTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidConfigTest, NamesKeyValueAndLine) {
  const InvalidCase& c = GetParam();
  const std::string message = ParseError(c.yaml);
  EXPECT_THAT(message, AllOf(HasSubstr(c.path), HasSubstr(c.value),
                             HasSubstr("test.yaml:" + std::to_string(c.line) + ":")));
}

const InvalidCase kInvalidCases[] = {
    // Unknown keys.
    {"UnknownTopLevelKey", "engine:\n  threads: 1\nenigne:\n  kind: cpu\n", "enigne:",
     "did you mean \"engine\"", 3},
    {"UnknownTopLevelKeyFromSection", "threads: 4\n", "threads:",
     "belongs in section \"engine\"", 1},
    {"UnknownKeyInSection", "engine:\n  kind: cpu\n  thraeds: 4\n", "engine.thraeds",
     "did you mean \"threads\"", 3},
    {"UnknownKeyListsKnownKeys", "log:\n  colour: true\n", "log.colour",
     "known keys: level", 2},
    // Wrong types.
    {"StringForInteger", "engine:\n  threads: eight\n", "engine.threads", "\"eight\"", 2},
    {"QuotedInteger", "limits:\n  max_sessions: \"8\"\n", "limits.max_sessions", "\"8\"", 2},
    {"BoolForInteger", "data_plane:\n  spin_us: true\n", "data_plane.spin_us", "\"true\"", 2},
    {"IntegerForBool", "engine:\n  idle_lower_classes: 1\n", "engine.idle_lower_classes",
     "expected true or false, got \"1\"", 2},
    {"YesForBool", "engine:\n  idle_lower_classes: yes\n", "engine.idle_lower_classes",
     "\"yes\"", 2},
    {"QuotedBool", "engine:\n  idle_lower_classes: \"true\"\n", "engine.idle_lower_classes",
     "\"true\"", 2},
    {"FloatForInteger", "timeouts:\n  collective_ms: 1.5\n", "timeouts.collective_ms",
     "\"1.5\"", 2},
    {"MapForScalar", "data_plane:\n  spin_us:\n    a: 1\n", "data_plane.spin_us", "a map", 3},
    {"UnknownSpinMode", "data_plane:\n  spin_mode: busy\n", "data_plane.spin_mode",
     "unknown spin mode \"busy\"; modes: \"yield\", \"pause\"", 2},
    {"ListForString", "log:\n  level: [info]\n", "log.level", "a list", 2},
    {"MissingValue", "engine:\n  threads:\nlog:\n  level: info\n", "engine.threads",
     "missing value", 2},
    {"SectionNotAMap", "\nengine: cpu\n", "engine:", "\"cpu\"", 2},
    {"SectionIsAList", "log:\n  - level\n", "log:", "a list", 2},
    {"DocumentNotAMap", "- node\n- engine\n", "(top level)", "a list", 1},
    {"UidsNotAList", "node:\n  allowed_uids: 1000\n", "node.allowed_uids", "\"1000\"", 2},
    {"UidNotAnInteger", "node:\n  allowed_uids:\n    - 0\n    - root\n",
     "node.allowed_uids[1]", "\"root\"", 4},
    {"SizeNotASize", "limits:\n  max_session_bytes: lots\n", "limits.max_session_bytes",
     "\"lots\"", 2},
    {"SizeUnknownUnit", "limits:\n  max_session_bytes: 64XB\n", "limits.max_session_bytes",
     "\"64XB\"", 2},
    {"SizeFraction", "limits:\n  max_session_bytes: 1.5GiB\n", "limits.max_session_bytes",
     "\"1.5GiB\" has a fraction", 2},
    // Out of range.
    {"ThreadsTooMany", "engine:\n  threads: 1025\n", "engine.threads", "\"1025\" is out of "
     "range [0, 1024]", 2},
    {"ThreadsNegative", "engine:\n  threads: -1\n", "engine.threads", "\"-1\"", 2},
    {"MaxSessionsNegative", "limits:\n  max_sessions: -3\n", "limits.max_sessions",
     "\"-3\" is out of range [1, 65536]", 2},
    {"MaxSessionsZero", "limits:\n  max_sessions: 0\n", "limits.max_sessions",
     "\"0\" is out of range [1, 65536]", 2},
    {"UidShareZero", "limits:\n  uid_share_percent: 0\n", "limits.uid_share_percent",
     "\"0\" is out of range [1, 100]", 2},
    {"UidShareOver100", "limits:\n  uid_share_percent: 101\n", "limits.uid_share_percent",
     "\"101\" is out of range [1, 100]", 2},
    {"MaxBuffersTooMany", "limits:\n  max_buffers_per_session: 1000001\n",
     "limits.max_buffers_per_session", "\"1000001\" is out of range [1, 1000000]", 2},
    {"MaxGroupsZero", "limits:\n  max_groups_per_job: 0\n", "limits.max_groups_per_job",
     "\"0\" is out of range [1, 1000000]", 2},
    {"SpinTooLong", "data_plane:\n  spin_us: 100001\n", "data_plane.spin_us",
     "\"100001\" is out of range [0, 100000]", 2},
    {"CollectiveZero", "timeouts:\n  collective_ms: 0\n", "timeouts.collective_ms",
     "\"0\" is out of range [1, 86400000]", 2},
    // "-0" is 0 (node_config_fuzz found it accepted, then refused on reload).
    {"CollectiveNegativeZero", "timeouts:\n  collective_ms: -000\n", "timeouts.collective_ms",
     "\"-000\" is out of range [1, 86400000]", 2},
    {"CollectiveTooLong", "timeouts:\n  collective_ms: 86400001\n", "timeouts.collective_ms",
     "\"86400001\"", 2},
    {"DataConnectTooLong", "timeouts:\n  data_connect_ms: 600001\n", "timeouts.data_connect_ms",
     "\"600001\" is out of range [1, 600000]", 2},
    {"GraceOverflow", "timeouts:\n  shutdown_grace_ms: 99999999999999999999999\n",
     "timeouts.shutdown_grace_ms", "\"99999999999999999999999\" is out of range [0, 600000]", 2},
    {"ConnectionsPerUidZero", "limits:\n  max_connections_per_uid: 0\n",
     "limits.max_connections_per_uid", "\"0\" is out of range [1, 65536]", 2},
    {"ConnectionsPerUidTooMany", "limits:\n  max_connections_per_uid: 65537\n",
     "limits.max_connections_per_uid", "\"65537\" is out of range [1, 65536]", 2},
    {"HelloZero", "timeouts:\n  hello_ms: 0\n", "timeouts.hello_ms",
     "\"0\" is out of range [1, 600000]", 2},
    {"HelloTooLong", "timeouts:\n  collective_ms: 5\n  hello_ms: 600001\n", "timeouts.hello_ms",
     "\"600001\" is out of range [1, 600000]", 3},
    {"IdleTooShort", "timeouts:\n  idle_connection_ms: 99\n", "timeouts.idle_connection_ms",
     "\"99\" is out of range [100, 86400000]", 2},
    {"RingTooSmall", "data_plane:\n  ring_entries: 8\n", "data_plane.ring_entries",
     "\"8\" is out of range [16, 65536]", 2},
    {"RingTooLarge", "data_plane:\n  ring_entries: 131072\n", "data_plane.ring_entries",
     "\"131072\"", 2},
    {"RingNotPowerOfTwo", "data_plane:\n  ring_entries: 1000\n", "data_plane.ring_entries",
     "\"1000\" is not a power of two", 2},
    {"InlineTooLarge", "engine:\n  inline_max_bytes: 65MiB\n", "engine.inline_max_bytes",
     "\"65MiB\" (68157440 bytes) is out of range: must be between 0 and 64MiB", 2},
    {"SessionBytesTooSmall", "limits:\n  max_session_bytes: 1KiB\n", "limits.max_session_bytes",
     "\"1KiB\" (1024 bytes) is out of range: must be at least 4096", 2},
    {"SessionBytesZero", "limits:\n  max_session_bytes: 0\n", "limits.max_session_bytes",
     "\"0\"", 2},
    {"NodeBytesTooSmall", "limits:\n  max_node_bytes: 100\n", "limits.max_node_bytes",
     "\"100\" (100 bytes) is out of range: must be 0 or at least 4096", 2},
    {"SizeNegative", "limits:\n  max_node_bytes: -5GiB\n", "limits.max_node_bytes",
     "\"-5GiB\" must not be negative", 2},
    {"SizeOverflow", "limits:\n  max_node_bytes: 16777216TiB\n", "limits.max_node_bytes",
     "\"16777216TiB\" is too large", 2},
    {"SizeDigitsOverflow", "limits:\n  max_node_bytes: 99999999999999999999\n",
     "limits.max_node_bytes", "\"99999999999999999999\" is too large", 2},
    {"UidOutOfRange", "node:\n  allowed_uids: [0, 4294967295]\n", "node.allowed_uids[1]",
     "\"4294967295\" is out of range [0, 4294967294]", 2},
    {"UidNegative", "node:\n  allowed_uids: [-1]\n", "node.allowed_uids[0]", "\"-1\"", 2},
    // Socket mode.
    {"ModeWithoutLeadingZero", "node:\n  socket_mode: 660\n", "node.socket_mode", "\"660\"", 2},
    {"ModeTooLarge", "node:\n  socket_mode: 01777\n", "node.socket_mode",
     "\"01777\" is out of range [0, 0777]", 2},
    {"ModeNotOctal", "node:\n  socket_mode: 0o680\n", "node.socket_mode", "\"0o680\"", 2},
    {"ModeSymbolic", "node:\n  socket_mode: rw-rw----\n", "node.socket_mode", "\"rw-rw----\"",
     2},
    // Enumerations and strings.
    {"BadLogLevel", "log:\n  level: verbose\n", "log.level", "\"verbose\"", 2},
    {"UnknownEngine", "engine:\n  kind: gpu\n", "engine.kind", "\"gpu\"", 2},
    {"UnknownDeviceBackend", "engine:\n  device: rocm\n", "engine.device", "\"rocm\"", 2},
    {"RelativeSocket", "node:\n  socket: run/hsdpd.sock\n", "node.socket",
     "\"run/hsdpd.sock\" is not absolute", 2},
    {"NameWithControlCharacter", "node:\n  name: \"a\\tb\"\n", "node.name", "\"a\\tb\"", 2},
    // Duplicates.
    {"DuplicateKey", "engine:\n  threads: 2\n  kind: cpu\n  threads: 3\n", "engine.threads",
     "duplicate key \"threads\" (first at line 2)", 4},
    {"DuplicateSection", "log:\n  level: info\nengine: {}\nlog:\n  level: debug\n", "log:",
     "duplicate key \"log\" (first at line 1)", 4},
    // YAML syntax.
    {"SyntaxErrorUnclosedFlow", "engine:\n  threads: [1, 2\nlog:\n  level: info\n",
     "YAML syntax error", "end of sequence flow not found", 3},
    {"SyntaxErrorTab", "engine:\n\tthreads: 1\n", "YAML syntax error", "illegal map value", 2},
    {"SyntaxErrorUnknownAlias", "\n\nengine:\n  threads: *count\n", "YAML syntax error",
     "anchor is not defined", 4},
    {"SecondDocument", "log:\n  level: info\n---\nengine:\n  threads: 1\n", "(top level)",
     "second YAML document", 4},
};

INSTANTIATE_TEST_SUITE_P(AllKinds, InvalidConfigTest, ::testing::ValuesIn(kInvalidCases),
                         [](const ::testing::TestParamInfo<InvalidCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(NodeConfigTest, SocketPathLengthLimit) {
  const std::string longest = "/" + std::string(106, 's');  // 107 bytes + NUL fit sun_path
  EXPECT_EQ(ParseOk("node:\n  socket: " + longest + "\n").socket_path, longest);
  EXPECT_THAT(ParseError("node:\n  socket: " + longest + "s\n"),
              AllOf(HasSubstr("test.yaml:2: node.socket: socket path \"/sss"),
                    HasSubstr("is 108 bytes long")));
}

TEST(NodeConfigTest, UnknownKeyMessageListsKnownKeys) {
  EXPECT_THAT(ParseError("engine:\n  flavour: 1\n"),
              HasSubstr("known keys: kind, device, threads, inline_max_bytes"));
  EXPECT_THAT(ParseError("colour: 1\n"),
              HasSubstr("known sections: node, engine, limits, jobs, data_plane, timeouts, log"));
}

TEST(NodeConfigTest, SourceNameAppearsInMessages) {
  const absl::StatusOr<NodeConfig> config = ParseNodeConfig("bogus: 1\n", "/etc/hsdpd/node.yaml");
  EXPECT_THAT(config.status().message(), HasSubstr("/etc/hsdpd/node.yaml:1: bogus:"));
}

// ---------------------------------------------------------------------------
// Files.

// A temporary file holding `content`, removed on destruction.
class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    std::string pattern = ::testing::TempDir() + "node_config_test_XXXXXX";
    const int fd = mkstemp(pattern.data());
    EXPECT_GE(fd, 0);
    if (fd >= 0) {
      EXPECT_EQ(write(fd, content.data(), content.size()),
                static_cast<ssize_t>(content.size()));
      close(fd);
    }
    path_ = pattern;
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(LoadNodeConfigFileTest, MissingFileIsNotFound) {
  const std::string path = ::testing::TempDir() + "no_such_dir/node.yaml";
  const absl::StatusOr<NodeConfig> config = LoadNodeConfigFile(path);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound) << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr(path));
}

TEST(LoadNodeConfigFileTest, ReadsFile) {
  const TempFile file("engine:\n  threads: 3\n");
  const absl::StatusOr<NodeConfig> config = LoadNodeConfigFile(file.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->engine_threads, 3);
}

TEST(LoadNodeConfigFileTest, EmptyFileGivesDefaults) {
  const TempFile file("");
  const absl::StatusOr<NodeConfig> config = LoadNodeConfigFile(file.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, NodeConfig{});
}

TEST(LoadNodeConfigFileTest, ErrorsNameThePath) {
  const TempFile file("# header\nlimits:\n  max_sessions: 0\n");
  const absl::StatusOr<NodeConfig> config = LoadNodeConfigFile(file.path());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(),
              HasSubstr(file.path() + ":3: limits.max_sessions: value \"0\""));
}

// Found by tests/fuzz/node_config_fuzz: yaml-cpp 0.7 never finishes a root
// flow collection or quoted scalar followed by ',' (it allocated 20 GB on
// the first of these). Refused at once, naming the line.
TEST(ParseNodeConfigTest, DocumentsYamlCppWouldNotFinishAreRefused) {
  for (const char* text : {"{enginauto, device: fake}, 93listen36}}\n", "{a}, b", "[a], b",
                           "\"x\", b", "'x', b", "[[a], b], c", "engine: {}\n---\n[a]\n, b\n"}) {
    absl::StatusOr<NodeConfig> c = ParseNodeConfig(text, "bad.yaml");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(c.status().message()),
                AllOf(HasSubstr("bad.yaml:"), HasSubstr("does not end")))
        << text;
  }
  // What the check must not refuse: commas inside flow collections and plain
  // scalars, flow collections as values.
  EXPECT_TRUE(ParseNodeConfig("node:\n  allowed_uids: [0, 1000]\n  name: \"a, b\"\n", "ok.yaml").ok());
  EXPECT_TRUE(ParseNodeConfig("{engine: {kind: cpu, threads: 2}, limits: {max_sessions: 4}}\n",
                              "ok.yaml")
                  .ok());
}

TEST(LoadNodeConfigFileTest, DirectoryIsInvalid) {
  const absl::StatusOr<NodeConfig> config = LoadNodeConfigFile(::testing::TempDir());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr("directory"));
}

TEST(LoadNodeConfigFileTest, UnreadableFileIsPermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root can read any file";
  const TempFile file("log:\n  level: info\n");
  ASSERT_EQ(chmod(file.path().c_str(), 0), 0);
  const absl::StatusOr<NodeConfig> config = LoadNodeConfigFile(file.path());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kPermissionDenied) << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr(file.path()));
}

// Runs `body` with standard input redirected from `file`.
template <typename Body>
void WithStdinFrom(const TempFile& file, Body body) {
  const int saved = dup(STDIN_FILENO);
  ASSERT_GE(saved, 0);
  const int fd = open(file.path().c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(dup2(fd, STDIN_FILENO), STDIN_FILENO);
  close(fd);
  body();
  dup2(saved, STDIN_FILENO);
  close(saved);
}

TEST(LoadNodeConfigFileTest, ReadsStandardInput) {
  const TempFile file("data_plane:\n  spin_us: 7\n");
  WithStdinFrom(file, [] {
    const absl::StatusOr<NodeConfig> config = LoadNodeConfigFile("-");
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->spin_us, 7u);
  });
  WithStdinFrom(file, [] {
    const absl::StatusOr<NodeConfig> config = LoadNodeConfigFile("/dev/stdin");
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->spin_us, 7u);
  });
}

TEST(LoadNodeConfigFileTest, StandardInputErrorsSayStdin) {
  const TempFile file("log:\n  level: loud\n");
  WithStdinFrom(file, [] {
    const absl::StatusOr<NodeConfig> config = LoadNodeConfigFile("-");
    EXPECT_THAT(config.status().message(), HasSubstr("<stdin>:2: log.level:"));
  });
}

TEST(LoadNodeConfigFileTest, ReadsDefaultYamlBack) {
  const TempFile file(DefaultNodeConfigYaml());
  const absl::StatusOr<NodeConfig> config = LoadNodeConfigFile(file.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, NodeConfig{});
}

}  // namespace
}  // namespace hsdp
