// Package jsonstr decodes JSON strings exactly as encoding/json decodes
// them, fast: Unquote turns a string's raw bytes into its value (escapes
// decoded, invalid UTF-8 and unpaired surrogates as U+FFFD), and
// ValidUTF8 is utf8.Valid as a branch-free DFA. The request parser
// (pkg/openai) and the chat template's JSON decoder (pkg/tokenize) both
// read strings with it, so the text a template renders is byte for byte
// the text the parser decoded. It holds no state and starts no goroutine.
package jsonstr
