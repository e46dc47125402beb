// Package jsonscan reads JSON text in place exactly as encoding/json reads
// it. A Scanner is a cursor over the text with the grammar's pieces (white
// space, strings, numbers, literals, a whole value skipped within
// encoding/json's nesting bound, objects and arrays walked member by
// member): it accepts exactly what encoding/json accepts (RFC 8259; any
// bytes in strings but control characters) and refuses the rest with a
// *SyntaxError at encoding/json's offset, in its words. Unquote decodes a
// string as encoding/json decodes it (escapes, and invalid UTF-8 and
// unpaired surrogates as U+FFFD); ValidUTF8 is utf8.Valid, branch-free.
//
// Values are read where they lie: a skipped value is checked and never
// decoded, a string's raw bytes and a number's literal are views of the
// input, and only a decoded string that differs from its raw bytes is
// allocated. The request parser (pkg/openai) and the tokenizer's JSON
// readers (pkg/tokenize: template values, the engines' token id answers)
// both read with it, so a request's text is the same text, byte for byte,
// wherever it is read. It imports nothing of ours, holds no state beyond
// a Scanner's cursor and starts no goroutine; a Scanner is not safe for
// concurrent use.
package jsonscan
