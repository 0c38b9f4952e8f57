#include "runtime/unicode.h"

#include <algorithm>
#include <array>

#include "core/error.h"

namespace sparrow::unicode {

namespace {

Category category_from_table(uint32_t cp) {
    // Last run whose first code point is <= cp (the first run starts at U+0000).
    const uint32_t *begin = detail::k_category_runs;
    const uint32_t *end = begin + detail::k_category_run_count;
    const uint32_t *it = std::upper_bound(begin, end, cp, [](uint32_t c, uint32_t run) { return c < (run >> 8); });
    return static_cast<Category>(it[-1] & 0xff);
}

}  // namespace

const char *unicode_version() { return detail::k_unicode_version; }

Category category(uint32_t cp) {
    // Latin-1 is by far the most frequent input: look it up in a table built once.
    static const std::array<Category, 256> k_latin1 = [] {
        std::array<Category, 256> t{};
        for (uint32_t c = 0; c < 256; ++c) t[c] = category_from_table(c);
        return t;
    }();
    if (cp < 256) return k_latin1[cp];
    if (cp > 0x10FFFF) return Category::Cn;
    return category_from_table(cp);
}

bool is_whitespace(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    switch (cp) {
        case 0x85:
        case 0xA0:
        case 0x1680:
        case 0x2028:
        case 0x2029:
        case 0x202F:
        case 0x205F:
        case 0x3000: return true;
        default: return cp >= 0x2000 && cp <= 0x200A;
    }
}

Utf8Char decode_utf8(std::string_view s, size_t pos) {
    const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
    const Utf8Char bad{0xFFFD, 1, false};
    const uint8_t b0 = byte(pos);
    if (b0 < 0x80) return {b0, 1, true};
    uint32_t len, cp, min_cp;
    if ((b0 & 0xE0) == 0xC0) {
        len = 2, cp = b0 & 0x1F, min_cp = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
        len = 3, cp = b0 & 0x0F, min_cp = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
        len = 4, cp = b0 & 0x07, min_cp = 0x10000;
    } else {
        return bad;  // continuation byte or 0xF8..0xFF as a lead
    }
    if (pos + len > s.size()) return bad;
    for (uint32_t i = 1; i < len; ++i) {
        const uint8_t b = byte(pos + i);
        if ((b & 0xC0) != 0x80) return bad;
        cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return bad;
    return {cp, len, true};
}

void append_utf8(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

size_t utf8_complete_prefix(std::string_view s) {
    // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
    const size_t n = s.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        const uint8_t b = static_cast<uint8_t>(s[n - back]);
        if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for its lead
        size_t need = 0;
        if ((b & 0xE0) == 0xC0)
            need = 2;
        else if ((b & 0xF0) == 0xE0)
            need = 3;
        else if ((b & 0xF8) == 0xF0)
            need = 4;
        return need > back ? n - back : n;
    }
    return n;
}

namespace {

struct ByteMap {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, 324> from_cp{};  // mapped code points are all below 256 + 68
};

const ByteMap &byte_map() {
    static const ByteMap k_map = [] {
        ByteMap m;
        m.from_cp.fill(-1);
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            m.to_cp[b] = printable ? b : next++;
            m.from_cp[m.to_cp[b]] = static_cast<int16_t>(b);
        }
        return m;
    }();
    return k_map;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return byte_map().to_cp[b]; }

int byte_from_codepoint(uint32_t cp) {
    const ByteMap &m = byte_map();
    return cp < m.from_cp.size() ? m.from_cp[cp] : -1;
}

CodepointText prepare_text(std::string_view s) {
    CodepointText t;
    t.cps.reserve(s.size());
    t.cls.reserve(s.size());
    t.offsets.reserve(s.size() + 1);
    size_t pos = 0;
    while (pos < s.size()) {
        const Utf8Char c = decode_utf8(s, pos);
        t.cps.push_back(c.cp);
        uint8_t cls = static_cast<uint8_t>(category(c.cp));
        if (is_whitespace(c.cp)) cls |= k_cls_space;
        t.cls.push_back(cls);
        t.offsets.push_back(static_cast<uint32_t>(pos));
        pos += c.len;
    }
    t.offsets.push_back(static_cast<uint32_t>(s.size()));
    return t;
}

}  // namespace sparrow::unicode
