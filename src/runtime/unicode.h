// Unicode helpers for the tokenizers: UTF-8 decoding that never loses a byte, general categories (from a
// generated table, see scripts/gen_unicode_tables.py), the White_Space property, and the GPT-2 byte <-> code
// point mapping used by byte-level BPE vocabularies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sparrow::unicode {

// Unicode general categories, in the order of the generated table (do not reorder).
enum class Category : uint8_t {
    Lu,
    Ll,
    Lt,
    Lm,
    Lo,  // letters
    Mn,
    Mc,
    Me,  // marks
    Nd,
    Nl,
    No,  // numbers
    Pc,
    Pd,
    Ps,
    Pe,
    Pi,
    Pf,
    Po,  // punctuation
    Sm,
    Sc,
    Sk,
    So,  // symbols
    Zs,
    Zl,
    Zp,  // separators
    Cc,
    Cf,
    Cs,
    Co,
    Cn,  // other (Cn: unassigned)
};
constexpr int k_category_count = 30;

// Bit masks over categories, for character classes such as \p{L}.
constexpr uint32_t category_bit(Category c) { return 1u << static_cast<uint32_t>(c); }
constexpr uint32_t k_mask_letter = category_bit(Category::Lu) | category_bit(Category::Ll) |
                                   category_bit(Category::Lt) | category_bit(Category::Lm) | category_bit(Category::Lo);
constexpr uint32_t k_mask_mark = category_bit(Category::Mn) | category_bit(Category::Mc) | category_bit(Category::Me);
constexpr uint32_t k_mask_number = category_bit(Category::Nd) | category_bit(Category::Nl) | category_bit(Category::No);
constexpr uint32_t k_mask_punctuation =
    category_bit(Category::Pc) | category_bit(Category::Pd) | category_bit(Category::Ps) | category_bit(Category::Pe) |
    category_bit(Category::Pi) | category_bit(Category::Pf) | category_bit(Category::Po);
constexpr uint32_t k_mask_symbol =
    category_bit(Category::Sm) | category_bit(Category::Sc) | category_bit(Category::Sk) | category_bit(Category::So);
constexpr uint32_t k_mask_separator =
    category_bit(Category::Zs) | category_bit(Category::Zl) | category_bit(Category::Zp);
constexpr uint32_t k_mask_other = category_bit(Category::Cc) | category_bit(Category::Cf) | category_bit(Category::Cs) |
                                  category_bit(Category::Co) | category_bit(Category::Cn);

Category category(uint32_t cp);  // Cn for values above U+10FFFF
const char *unicode_version();   // of the generated table, e.g. "14.0.0"

// The White_Space property (what \s matches in the pre-tokenizer regexes): TAB..CR, space, U+0085, U+00A0,
// U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool is_whitespace(uint32_t cp);

// One UTF-8 sequence at `pos` (< s.size()). A malformed sequence (bad lead or continuation byte, overlong form,
// surrogate, beyond U+10FFFF, truncated) yields {U+FFFD, 1 byte, valid=false}: the caller keeps the raw byte.
struct Utf8Char {
    uint32_t cp;
    uint32_t len;
    bool valid;
};
Utf8Char decode_utf8(std::string_view s, size_t pos);
void append_utf8(std::string &out, uint32_t cp);
// Length of the longest prefix of `s` that does not end inside an incomplete (but so far valid) UTF-8
// sequence: what a streaming printer can emit now, holding the rest back for the next piece.
size_t utf8_complete_prefix(std::string_view s);

// GPT-2 byte-level BPE maps each byte to a printable code point: the bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF
// map to themselves, the other 68 bytes to U+0100, U+0101, ... in increasing byte order. Token texts of such
// vocabularies are written in these code points.
uint32_t byte_to_codepoint(uint8_t b);
int byte_from_codepoint(uint32_t cp);  // -1 when cp is not one of the 256 mapped code points

// Text prepared for the regex matcher: code points, their category (low 5 bits) and a White_Space flag (0x80),
// and the byte offset of each code point in the source (offsets has one more entry: the source length). A
// malformed byte is one entry of its own, classified like U+FFFD, so that byte ranges always tile the source.
struct CodepointText {
    std::vector<uint32_t> cps;
    std::vector<uint8_t> cls;
    std::vector<uint32_t> offsets;
    size_t size() const { return cps.size(); }
};
constexpr uint8_t k_cls_space = 0x80;
constexpr uint8_t k_cls_category = 0x1f;
CodepointText prepare_text(std::string_view s);

namespace detail {
// The generated table (unicode_tables.cpp): runs of equal category, (first code point << 8) | category.
extern const char k_unicode_version[];
extern const uint32_t k_category_runs[];
extern const size_t k_category_run_count;
}  // namespace detail

}  // namespace sparrow::unicode
