/* GPT-2's byte-level BPE tokenizer (OpenAI's encoder.py, tiktoken's "gpt2"),
 * in C without Lua. Loading reads encoder.json (token -> id, tokens spelled
 * in the bytes_to_unicode alphabet) and vocab.bpe (the merges, by rank).
 * Encoding: the text (UTF-8, checked) is cut by GPT-2's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (the classes from unicode_tables.h), and each piece's bytes are merged by
 * the lowest-ranked adjacent pair until no pair is a merge. Ids are 0-based
 * (tiktoken's). The special token <|endoftext|> is only produced where the
 * caller allows it. */
#ifndef ATTN_TOKENIZER_H
#define ATTN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

typedef struct attn_tokenizer attn_tokenizer;

#define ATTN_TOKENIZER_EOT_TEXT "<|endoftext|>"

/* Load encoder.json and vocab.bpe; every malformed file is an ATTN_EARG naming
 * the path (and the line or byte offset). Free with attn_tokenizer_free. */
attn_status attn_tokenizer_load(const char *encoder_json_path, const char *vocab_bpe_path, attn_tokenizer **out);
void attn_tokenizer_free(attn_tokenizer *tok);

/* Number of ids (50257 for GPT-2) and the id of <|endoftext|> (-1 if absent). */
int32_t attn_tokenizer_n_vocab(const attn_tokenizer *tok);
int32_t attn_tokenizer_eot(const attn_tokenizer *tok);

/* Byte offset of the first "<|endoftext|>" in text, or -1. */
int64_t attn_tokenizer_find_special(const char *text, size_t len);

/* Check that text is UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF): ATTN_EARG naming the byte offset (0-based) of the first bad byte. */
attn_status attn_utf8_check(const char *text, size_t len);

/* Encode text (len bytes). With allow_eot, each "<|endoftext|>" becomes the
 * end-of-text id; without, it is plain text. ids must hold len entries (no
 * text gives more ids than bytes); *n_ids gets the count. ATTN_EARG for
 * invalid UTF-8 (naming the byte offset), ATTN_ENOMEM without scratch. */
attn_status attn_tokenizer_encode(attn_tokenizer *tok, const char *text, size_t len, int allow_eot,
                                  int32_t *ids, size_t *n_ids);

/* The bytes of token id (0 <= id < n_vocab): a pointer into the tokenizer
 * and its length. */
const char *attn_tokenizer_token(const attn_tokenizer *tok, int32_t id, size_t *len);

#endif
