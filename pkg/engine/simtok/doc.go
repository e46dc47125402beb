// Package simtok is the simulated engine's tokenizer, chat template and text
// generator. It is deliberately trivial, so that anyone can predict its output
// by hand, and the simulator's /tokenize endpoint and its engine agree by
// construction (both call this package).
//
// Tokens: every byte of the UTF-8 text is one token whose id is the byte value
// (0..255). Two special tokens follow: BOS (256, "<s>") and EOS (257, "</s>").
// Ids from 258 up to VocabSize-1 are valid in pre-tokenized prompts (they
// render as "<|t<id>|>") but are never produced by Encode. A completion
// prompt given as text is encoded as [BOS] + bytes when add_special_tokens is
// true (the default), bytes alone otherwise; a prompt given as token ids is
// used as is.
//
// Chat template (messages rendered to text, then byte-encoded, BOS first):
//
//	<s>                                 (the BOS token, id 256)
//	<|{role}|>\n{content}<|end|>\n      (once per message, in order)
//	<|assistant|>\n                     (only with add_generation_prompt)
//
// A message's content is either a string or a list of parts; the text parts
// are concatenated and other parts are ignored.
//
// Generated text is a stream of lowercase words from a fixed list, separated
// by single spaces, one byte (token) at a time, drawn by a PCG generator
// seeded from the engine seed and the prompt's tokens: the same prompt under
// the same seed always yields the same text.
//
// The package is pure: no goroutines, no clock, no shared mutable state.
package simtok
