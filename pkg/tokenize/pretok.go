package tokenize

import (
	"unicode"
	"unicode/utf8"
)

// splitFlavor names a pre-tokenizer split pattern this package implements by
// hand. The patterns use a negative look-ahead (\s+(?!\S)) that Go's regexp
// cannot express, and a hand-written scanner is also several times faster.
type splitFlavor int

const (
	// flavorLlama3 is Llama-3's pattern:
	//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
	//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
	flavorLlama3 splitFlavor = iota + 1
	// flavorQwen2 is the same with \p{N} (one digit per piece), as in Qwen2
	// and Qwen3.
	flavorQwen2
	// flavorGPT2 is GPT-2's ByteLevel pattern:
	//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
	flavorGPT2
	// flavorO200k is gpt-oss's pattern (pretok_o200k.go).
	flavorO200k
	// flavorDeepSeek is DeepSeek-V3's sequence of three splits
	// (pretok_deepseek.go).
	flavorDeepSeek
	// flavorWhole leaves each segment whole (Gemma 3: its split on " "
	// runs after every " " became U+2581); the model is character-level.
	flavorWhole
)

const (
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternGPT2   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// flavorOf maps a Split pre-tokenizer regex to the scanner implementing it.
func flavorOf(pattern string) (splitFlavor, bool) {
	switch pattern {
	case patternLlama3:
		return flavorLlama3, true
	case patternQwen2:
		return flavorQwen2, true
	case patternGPT2:
		return flavorGPT2, true
	case patternO200k:
		return flavorO200k, true
	}
	return 0, false
}

// Character classes of the patterns.
const (
	clsOther   = iota // [^\s\p{L}\p{N}]
	clsLetter         // \p{L}
	clsNumber         // \p{N}
	clsSpace          // \s, not \r or \n
	clsNewline        // \r or \n
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := 0; c < utf8.RuneSelf; c++ {
		r := rune(c)
		switch {
		case r == '\r' || r == '\n':
			t[c] = clsNewline
		case unicode.IsSpace(r):
			t[c] = clsSpace
		case unicode.IsLetter(r):
			t[c] = clsLetter
		case unicode.IsNumber(r):
			t[c] = clsNumber
		default:
			t[c] = clsOther
		}
	}
	return t
}()

// classAt decodes the rune at s[i:] and returns its class, the rune and its
// width. Invalid UTF-8 never reaches here (inputs are validated first), but a
// stray byte is classed as clsOther with width 1 so the scanner still
// advances.
func classAt(s string, i int) (cls uint8, r rune, w int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return asciiClass[c], rune(c), 1
	}
	r, w = utf8.DecodeRuneInString(s[i:])
	if r == 0x85 { // NEL: White_Space, category Cc
		return clsSpace, r, w
	}
	return gcClass[gcOf(r)], r, w
}

// gcOf is r's Unicode 16 General_Category (ucd_table.go); the reference's
// regex engine classifies with Unicode 16, Go's unicode package with 15.
func gcOf(r rune) uint8 {
	if uint32(r) > 0x10ffff {
		return gcCn
	}
	return ucdStage2[int(ucdStage1[r>>8])<<8|int(r&0xff)]
}

// gcClass maps a general category to the patterns' classes. \s is the
// White_Space property: outside ASCII (asciiClass) that is the Zs, Zl and
// Zp categories plus U+0085, a control that classAt tests for first.
var gcClass = func() (t [32]uint8) {
	for gc := range t {
		switch uint8(gc) {
		case gcLu, gcLl, gcLt, gcLm, gcLo:
			t[gc] = clsLetter
		case gcNd, gcNl, gcNo:
			t[gc] = clsNumber
		case gcZs, gcZl, gcZp:
			t[gc] = clsSpace
		default:
			t[gc] = clsOther
		}
	}
	return t
}()

// splitPieces calls emit for each pre-token of s, in order, as [start, end)
// byte offsets. The pieces cover s exactly.
func splitPieces(f splitFlavor, s string, emit func(start, end int)) {
	for i := 0; i < len(s); {
		e := nextPiece(f, s, i)
		emit(i, e)
		i = e
	}
}

// nextPiece returns the end of the pre-token starting at i (i < len(s)),
// trying the pattern's alternatives in order as the regex engine would.
func nextPiece(f splitFlavor, s string, i int) int {
	switch f {
	case flavorWhole:
		return len(s)
	case flavorO200k:
		return nextPieceO200k(s, i)
	case flavorDeepSeek:
		return nextPieceDeepSeek(s, i)
	}
	c0, r0, w0 := classAt(s, i)
	n := len(s)
	// Contractions.
	if r0 == '\'' && i+1 < n {
		if e := contraction(s, i+1, f != flavorGPT2); e > 0 {
			return e
		}
	}
	var c1 uint8 = 255
	var r1 rune
	var w1 int
	if i+w0 < n {
		c1, r1, w1 = classAt(s, i+w0)
	}
	_ = r1
	if f == flavorGPT2 {
		// ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
		start, cls := i, c0
		if r0 == ' ' && c1 != 255 && (c1 == clsLetter || c1 == clsNumber || c1 == clsOther) {
			start, cls = i+w0, c1
		}
		if cls == clsLetter || cls == clsNumber || cls == clsOther {
			return runOf(s, start, cls, -1)
		}
		return whitespace(s, i, false)
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c0 == clsLetter {
		return runOf(s, i, clsLetter, -1)
	}
	if (c0 == clsOther || c0 == clsSpace) && c1 == clsLetter {
		return runOf(s, i+w0+w1, clsLetter, -1)
	}
	// \p{N}{1,3} or \p{N}
	if c0 == clsNumber {
		if f == flavorQwen2 {
			return i + w0
		}
		return runOf(s, i, clsNumber, 3)
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	start := -1
	if c0 == clsOther {
		start = i
	} else if r0 == ' ' && c1 == clsOther {
		start = i + w0
	}
	if start >= 0 {
		e := runOf(s, start, clsOther, -1)
		for e < n && (s[e] == '\r' || s[e] == '\n') {
			e++
		}
		return e
	}
	return whitespace(s, i, true)
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d after the apostrophe at j-1,
// case-insensitively (with Unicode simple folding: ſ matches s) when fold is
// set. It returns the end offset or 0.
func contraction(s string, j int, fold bool) int {
	lower := func(k int) (rune, int) {
		if k >= len(s) {
			return 0, 0
		}
		r, w := utf8.DecodeRuneInString(s[k:])
		if fold {
			switch r {
			case 'S', 'T', 'R', 'E', 'V', 'M', 'L', 'D':
				r += 'a' - 'A'
			case 'ſ':
				r = 's'
			}
		}
		return r, w
	}
	r, w := lower(j)
	switch r {
	case 's', 't', 'm', 'd':
		return j + w
	case 'r', 'v', 'l':
		want := rune('e')
		if r == 'l' {
			want = 'l'
		}
		if r2, w2 := lower(j + w); r2 == want {
			return j + w + w2
		}
	}
	return 0
}

// runOf returns the end of the run of class cls starting at i, at most max
// runes long when max > 0.
func runOf(s string, i int, cls uint8, max int) int {
	count := 0
	for i < len(s) {
		c, _, w := classAt(s, i)
		if c != cls {
			break
		}
		i += w
		count++
		if max > 0 && count == max {
			break
		}
	}
	return i
}

// whitespace handles the whitespace alternatives at i (s[i] is white space):
// \s*[\r\n]+ (when newlines is set), then \s+(?!\S), then \s+.
func whitespace(s string, i int, newlines bool) int {
	e, lastNL, last := i, -1, i
	for e < len(s) {
		c, _, w := classAt(s, e)
		if c != clsSpace && c != clsNewline {
			break
		}
		if c == clsNewline {
			lastNL = e + w
		}
		last = e
		e += w
	}
	if e == i {
		// Not white space at all: cannot happen for well-formed input, but
		// never loop forever.
		_, _, w := classAt(s, i)
		return i + w
	}
	if newlines && lastNL > 0 {
		return lastNL
	}
	if e == len(s) || last == i {
		return e
	}
	return last
}
