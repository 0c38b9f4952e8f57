// Stop strings over streamed text: the cut, the held-back tail, and UTF-8 boundaries.
#include "server/stop_strings.h"

#include <gtest/gtest.h>

namespace sparrow::server {
namespace {

TEST(StopStrings, FindsTheEarliestStop) {
    const std::vector<std::string> stops = {"END", "ab"};
    const StopScan s = scan_stop_strings("xxabyyEND", 0, stops);
    EXPECT_EQ(s.stop_at, 2u);
    EXPECT_EQ(scan_stop_strings("xxEND ab", 0, stops).stop_at, 2u);
}

TEST(StopStrings, HoldsBackAPossibleStart) {
    const std::vector<std::string> stops = {"STOP"};
    EXPECT_EQ(scan_stop_strings("hello ST", 0, stops).safe_end, 6u);   // "ST" may start "STOP"
    EXPECT_EQ(scan_stop_strings("hello STX", 0, stops).safe_end, 9u);  // it did not
    EXPECT_EQ(scan_stop_strings("hello S", 6, stops).safe_end, 6u);    // nothing new to send
    EXPECT_EQ(scan_stop_strings("abc", 0, {}).safe_end, 3u);
}

TEST(StopStrings, SearchesOnlyWhatWasNotSent) {
    // Text before `from` was sent; a stop there cannot be cut any more and is not reported.
    EXPECT_EQ(scan_stop_strings("STOP and more", 4, {"STOP"}).stop_at, StopScan::npos);
}

TEST(StopStrings, NeverSplitsAUtf8Character) {
    const std::string text = "caf\xc3";  // "é" is C3 A9; only its first byte so far
    EXPECT_EQ(scan_stop_strings(text, 0, {}).safe_end, 3u);
    EXPECT_EQ(scan_stop_strings(text + "\xa9", 0, {}).safe_end, 5u);
}

TEST(StopStrings, IgnoresEmptyStops) {
    EXPECT_EQ(scan_stop_strings("abc", 0, {""}).stop_at, StopScan::npos);
    EXPECT_EQ(scan_stop_strings("abc", 0, {""}).safe_end, 3u);
}

}  // namespace
}  // namespace sparrow::server
