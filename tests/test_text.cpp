// Tests of prepack/text/: UTF-8 against its definition (RFC 3629), the tokenizers on small
// vocabularies whose tokenization follows from the BPE and SentencePiece definitions by hand,
// round trips of random text, special tokens, text decoded token by token, and every error the
// loaders and the tokenizer exist to give. (Tokenization of real text against Hugging Face's
// tokenizers on a real vocabulary: tests/oracle/tokenize_hf.py.)
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "common.hpp"
#include "prepack/text.hpp"

namespace {

namespace text = prepack::text;
using ids = std::vector<std::int32_t>;

// ---- UTF-8 ----

TEST(Utf8, ValidSequencesAndEveryKindOfInvalidOne) {
  EXPECT_EQ(text::utf8::valid_at("a", 0), 1u);
  EXPECT_EQ(text::utf8::valid_at("\xc3\xa9", 0), 2u);          // é
  EXPECT_EQ(text::utf8::valid_at("\xe4\xb8\xad", 0), 3u);      // 中
  EXPECT_EQ(text::utf8::valid_at("\xf0\x9f\x98\x80", 0), 4u);  // 😀
  EXPECT_EQ(text::utf8::valid_at("\xc0\x80", 0), 0u);          // overlong NUL
  EXPECT_EQ(text::utf8::valid_at("\xe0\x80\xaf", 0), 0u);      // overlong '/'
  EXPECT_EQ(text::utf8::valid_at("\xed\xa0\x80", 0), 0u);      // surrogate U+D800
  EXPECT_EQ(text::utf8::valid_at("\xf4\x90\x80\x80", 0), 0u);  // U+110000
  EXPECT_EQ(text::utf8::valid_at("\xe4\xb8", 0), 0u);          // cut short
  EXPECT_EQ(text::utf8::valid_at("\x80", 0), 0u);              // a lone continuation byte
  EXPECT_EQ(text::utf8::valid_at("\xc3\x41", 0), 0u);          // a lead without continuation
  EXPECT_PREPACK_ERROR(text::utf8::check("ok \xff", "prompt 3"),
                       "prompt 3: invalid UTF-8 at byte 3 (0xff)");
  EXPECT_NO_THROW(text::utf8::check("日本語 and emoji 😀", "x"));
  // Every code point's encoding decodes back and is valid.
  for (char32_t cp : {0x0u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    const std::string e = text::utf8::encode(cp);
    ASSERT_EQ(text::utf8::valid_at(e, 0), e.size()) << std::hex << cp;
    EXPECT_EQ(text::utf8::decode(e.data(), e.size()), cp);
  }
  EXPECT_EQ(text::utf8::complete_prefix("ab\xe4\xb8"), 2u);
  EXPECT_EQ(text::utf8::complete_prefix("ab\xe4\xb8\xad"), 5u);
  EXPECT_EQ(text::utf8::complete_prefix("\xf0\x9f\x98"), 0u);
  EXPECT_EQ(text::utf8::complete_prefix("a\x80"), 2u);  // invalid bytes are not held back
}

// ---- byte-level BPE on a vocabulary built by hand ----

// GPT-2's byte-to-unicode alphabet, written out from its definition: the printable bytes
// '!'..'~', 0xA1..0xAC, 0xAE..0xFF stand for themselves, the others (0x00..0x20, 0x7F..0xA0,
// 0xAD) for U+0100, U+0101, ... in byte order.
std::string gpt2_char(unsigned char b) {
  const auto printable = [](unsigned c) {
    return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
  };
  char32_t cp = b;
  if (!printable(b)) {
    cp = 0x100;
    for (unsigned c = 0; c < b; ++c) cp += printable(c) ? 0 : 1;
  }
  return text::utf8::encode(cp);
}

// Every byte as a token (ids 0..255 in byte order), then the merges' results.
text::vocabulary byte_vocab(const std::vector<std::string>& merges, const std::string& pre) {
  text::vocabulary v;
  v.name = "test-bpe";
  v.model = text::model_kind::bpe;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(gpt2_char(static_cast<unsigned char>(b)));
  for (const std::string& m : merges) {
    std::string joined = m;
    if (const auto sp = joined.find(' '); sp != std::string::npos) joined.erase(sp, 1);
    v.tokens.push_back(joined);
  }
  v.merges = merges;
  v.pre_patterns = text::pre_tokenizer_named(pre).patterns;
  return v;
}

TEST(Bpe, MergesApplyLowestRankFirstWithinEachPreTokenizedWord) {
  const std::string sp = gpt2_char(' ');  // Ġ
  // 256: "bc", 257: "ab", 258: "Ġa"
  const text::tokenizer bc_first(byte_vocab({"b c", "a b", sp + " a"}, "gpt-2"));
  // "abc": b c has rank 0, so a + bc; " abc" is one word (GPT-2's ' ?\p{L}+'): Ġ a b c, where
  // b c (rank 0) goes first, then Ġ a (rank 2).
  EXPECT_EQ(bc_first.encode("abc"), (ids{'a', 256}));
  EXPECT_EQ(bc_first.encode("abc abc"), (ids{'a', 256, 258, 256}));
  const text::tokenizer ab_first(byte_vocab({"a b", "b c"}, "gpt-2"));
  EXPECT_EQ(ab_first.encode("abc"), (ids{256, 'c'}));
  // Ties (one rank, two places) merge leftmost first: "aaa" with "a a" -> aa + a.
  const text::tokenizer aa(byte_vocab({"a a"}, "gpt-2"));
  EXPECT_EQ(aa.encode("aaa"), (ids{256, 'a'}));
  // Merges never cross the pre-tokenizer's words: "a1" is two words, so "a 1" cannot merge.
  const text::tokenizer a1(byte_vocab({"a 1"}, "gpt-2"));
  EXPECT_EQ(a1.encode("a1"), (ids{'a', '1'}));
  // smollm splits digits one by one before GPT-2's regex: "12" never merges.
  const text::tokenizer digits(byte_vocab({"1 2"}, "smollm"));
  EXPECT_EQ(digits.encode("12"), (ids{'1', '2'}));
  EXPECT_EQ(text::tokenizer(byte_vocab({"1 2"}, "gpt-2")).encode("12"), (ids{256}));
}

TEST(Bpe, IgnoreMergesKeepsAWordThatIsAToken) {
  // "abc" is a token (id 258) though no merge sequence reaches it from these merges' order.
  text::vocabulary v = byte_vocab({"b c", "a b"}, "llama-bpe");
  v.tokens.push_back("abc");
  EXPECT_TRUE(text::pre_tokenizer_named("llama-bpe").ignore_merges);
  v.ignore_merges = false;
  EXPECT_EQ(text::tokenizer(v).encode("abc"), (ids{'a', 256}));
  v.ignore_merges = true;
  EXPECT_EQ(text::tokenizer(v).encode("abc"), (ids{258}));
}

// Any text round-trips through a byte-level vocabulary: every byte has a token.
TEST(Bpe, RandomTextRoundTrips) {
  const std::string sp = gpt2_char(' ');
  const text::tokenizer t(byte_vocab({"t h", "th e", sp + " the", "i n", sp + " in"}, "llama-bpe"));
  std::mt19937_64 rng(7);
  const std::vector<std::string> pieces = {"the",   " in",  "  ",   "\n", "\t", "12345",
                                           "é",     "中文", "😀",    "'s", "ÄÖ", " ",
                                           "don't", "a",    "\r\n", "x"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) s += pieces[rng() % pieces.size()];
    const auto e = t.encode(s);
    EXPECT_EQ(t.decode(e), s) << "'" << s << "'";
  }
}

// ---- SentencePiece-style on a vocabulary built by hand ----

text::vocabulary spm_vocab() {
  text::vocabulary v;
  v.name = "test-spm";
  v.model = text::model_kind::spm;
  const auto add = [&](const std::string& t, float score, text::token_type type) {
    v.tokens.push_back(t);
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, text::token_type::unknown);  // 0
  add("<s>", 0, text::token_type::control);    // 1
  add("</s>", 0, text::token_type::control);   // 2
  for (int b = 0; b < 256; ++b) {              // 3 .. 258
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    add(hex, 0, text::token_type::byte);
  }
  const std::string u = "\xe2\x96\x81";         // ▁
  add(u, -1, text::token_type::normal);         // 259
  add("a", -2, text::token_type::normal);       // 260
  add("b", -3, text::token_type::normal);       // 261
  add(u + "a", -4, text::token_type::normal);   // 262
  add("ab", -5, text::token_type::normal);      // 263
  add(u + "ab", -6, text::token_type::normal);  // 264
  add("ba", -0.5f, text::token_type::normal);   // 265  scores higher than ▁a and ab
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.add_bos = true;
  v.add_space_prefix = true;
  return v;
}

TEST(Spm, HighestScoreFirstSpacesAsU2581AndByteFallback) {
  const text::tokenizer t(spm_vocab());
  // "ab" -> "▁ab": ▁a (-4) beats ab (-5), then ▁a + b = ▁ab.
  EXPECT_EQ(t.encode("ab"), (ids{1, 264}));
  EXPECT_EQ(t.encode("ab", {false}), (ids{264}));
  // "aba" -> ▁ a b a: pairs ▁a (-4), ab (-5), ba (-0.5): ba first, then ▁a: ▁a + ba.
  EXPECT_EQ(t.encode("aba", {false}), (ids{262, 265}));
  // Characters without a token become their UTF-8 bytes' tokens: é = C3 A9.
  EXPECT_EQ(t.encode("é", {false}), (ids{259, 3 + 0xC3, 3 + 0xA9}));
  // Decoding: ▁ is a space, byte tokens are bytes, control tokens vanish.
  EXPECT_EQ(t.decode(ids{1, 262, 261, 259, 3 + 0xC3, 3 + 0xA9}), " ab é");
  EXPECT_EQ(t.decode(ids{1, 262}, {true}), "<s> a");
  // The space prefix starts the text and follows every special token.
  EXPECT_EQ(t.encode("a</s>a", {false}), (ids{262, 2, 262}));
  EXPECT_EQ(t.encode("a</s>a", {false, false}),
            (ids{262, 3 + '<', 3 + '/', 3 + 's', 3 + '>', 260}));
}

TEST(Special, ControlTokensOnlyWhenAskedUserDefinedAlways) {
  text::vocabulary v = byte_vocab({}, "gpt-2");
  v.tokens.push_back("<|im_start|>");  // 256, control
  v.tokens.push_back("<tool>");        // 257, user-defined
  v.types.assign(v.tokens.size(), text::token_type::normal);
  v.types[256] = text::token_type::control;
  v.types[257] = text::token_type::user_defined;
  const text::tokenizer t(v);
  EXPECT_EQ(t.encode("<|im_start|>x<tool>"), (ids{256, 'x', 257}));
  const auto plain = t.encode("<|im_start|>x<tool>", {true, false});
  EXPECT_EQ(plain.back(), 257);
  EXPECT_EQ(plain.size(), std::string("<|im_start|>x").size() + 1);
  EXPECT_EQ(t.decode(ids{256, 'x'}), "x");
  EXPECT_EQ(t.decode(ids{256, 'x'}, {true}), "<|im_start|>x");
}

TEST(Stream, CharactersSplitAcrossTokensComeOutWhole) {
  const text::tokenizer t(byte_vocab({}, "gpt-2"));
  const std::string s = "a😀中";
  const auto e = t.encode(s);
  ASSERT_EQ(e.size(), s.size());  // one token per byte here
  text::text_stream out(t);
  std::vector<std::string> parts;
  for (std::int32_t id : e) parts.push_back(out.append(id));
  EXPECT_EQ(parts, (std::vector<std::string>{"a", "", "", "", "😀", "", "", "中"}));
  EXPECT_EQ(out.finish(), "");
  text::text_stream cut(t);
  EXPECT_EQ(cut.append(e[1]), "");
  EXPECT_EQ(cut.finish(), s.substr(1, 1));
}

// ---- errors ----

TEST(TextErrors, NamedAndCaughtBeforeUse) {
  const text::tokenizer t(byte_vocab({}, "gpt-2"));
  EXPECT_PREPACK_ERROR(t.encode("ab\xc3"), "test-bpe: text: invalid UTF-8 at byte 2 (0xc3)");
  EXPECT_PREPACK_ERROR(t.piece(256), "test-bpe: token id 256 outside the vocabulary of 256");
  EXPECT_PREPACK_ERROR(t.piece(-1), "token id -1");
  EXPECT_PREPACK_ERROR(text::tokenizer(byte_vocab({"ab"}, "gpt-2")), "merge 0 'ab' has no space");
  EXPECT_PREPACK_ERROR(text::pre_tokenizer_named("tekken"),
                       "pre-tokenizer 'tekken' is not supported");
  text::vocabulary bad_regex = byte_vocab({}, "gpt-2");
  bad_regex.pre_patterns = {"(unclosed"};
  EXPECT_PREPACK_ERROR(text::tokenizer{bad_regex},
                       "regex '(unclosed': missing closing parenthesis");
  text::vocabulary bos = byte_vocab({}, "gpt-2");
  bos.bos = 300;
  EXPECT_PREPACK_ERROR(text::tokenizer{bos}, "bos id 300 outside the vocabulary of 256");
  bos.bos = -1;
  bos.add_bos = true;
  EXPECT_PREPACK_ERROR(text::tokenizer{bos}, "add_bos without a bos token");
  text::vocabulary types = byte_vocab({}, "gpt-2");
  types.types.resize(3);
  EXPECT_PREPACK_ERROR(text::tokenizer{types}, "3 token types for 256 tokens");
  text::vocabulary spm = spm_vocab();
  spm.scores.clear();
  EXPECT_PREPACK_ERROR(text::tokenizer{spm}, "SentencePiece-style vocabulary without scores");
  // A vocabulary that cannot spell a character and has no unknown token.
  text::vocabulary small;
  small.name = "tiny";
  small.model = text::model_kind::bpe;
  small.tokens = {"a"};
  EXPECT_PREPACK_ERROR(text::tokenizer(small).encode("b"), "tiny: tokenizer: 'b' has no token");
}

TEST(TextErrors, LoadersNameTheFileAndItem) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("prepack_text_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir / name) << body;
  };
  EXPECT_PREPACK_ERROR(text::load_tokenizer((dir / "none.gguf").string()),
                       "none.gguf: cannot open (No such file or directory)");
  EXPECT_PREPACK_ERROR(text::load_tokenizer(dir.string()), "tokenizer.json: cannot open");
  write("tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
  EXPECT_PREPACK_ERROR(text::load_tokenizer(dir.string()), "model type 'Unigram' is not supported");
  write("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true}}");
  EXPECT_PREPACK_ERROR(text::load_tokenizer(dir.string()), "SentencePiece-style BPE");
  write("tokenizer.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
        "\"pre_tokenizer\": {\"type\": \"Whitespace\"}}");
  EXPECT_PREPACK_ERROR(text::load_tokenizer(dir.string()),
                       "pre_tokenizer Whitespace is not supported");
  write("tokenizer.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"zero\"}, \"merges\": []}, "
        "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}");
  EXPECT_PREPACK_ERROR(text::load_tokenizer(dir.string()), "vocab entry 'a' has no integer id");
  write("tokenizer.json", "{\"model\": ");
  EXPECT_PREPACK_ERROR(text::load_tokenizer(dir.string()), "tokenizer.json: not JSON");
  write("tokenizer.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [3]}, "
        "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}");
  EXPECT_PREPACK_ERROR(text::load_tokenizer(dir.string()), "a merge is neither");
  // A GGUF file without tokenizer metadata.
  const std::string gguf = (dir / "empty.gguf").string();
  {
    std::ofstream f(gguf, std::ios::binary);
    const char header[] = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    f.write(header, sizeof header);
    const std::uint64_t zero = 0;
    f.write(reinterpret_cast<const char*>(&zero), 8);  // tensors
    f.write(reinterpret_cast<const char*>(&zero), 8);  // metadata
  }
  EXPECT_PREPACK_ERROR(text::load_tokenizer(gguf), "empty.gguf: no tokenizer");
  fs::remove_all(dir);
}

}  // namespace
