// prepack/text.hpp - the prepack::text component: a model's own tokenizer (byte-level BPE and
// SentencePiece-style), loaded from GGUF metadata or a Hugging Face tokenizer.json; UTF-8 in
// and out. Link prepack::text (PCRE2, nlohmann-json, POSIX).
#pragma once

#include "text/load.hpp"
#include "text/regex.hpp"
#include "text/tokenizer.hpp"
#include "text/utf8.hpp"
#include "text/vocabulary.hpp"
