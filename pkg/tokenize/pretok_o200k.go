package tokenize

import "unicode/utf8"

// The gpt-oss (o200k) split pattern:
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// scanned by hand with the backtracking regex engine's order: the first
// alternative that matches wins, an optional prefix is tried consumed
// first, greedy runs give back one character at a time.
const patternO200k = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// Character bits of the o200k pattern.
const (
	oL  uint8 = 1 << iota // \p{L}
	oN                    // \p{N}
	oU                    // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	oW                    // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
	oS                    // \s
	oNL                   // \r or \n
)

var o200kGC = func() (t [32]uint8) {
	for gc := range t {
		switch uint8(gc) {
		case gcLu, gcLt:
			t[gc] = oL | oU
		case gcLl:
			t[gc] = oL | oW
		case gcLm, gcLo:
			t[gc] = oL | oU | oW
		case gcMn, gcMc, gcMe:
			t[gc] = oU | oW
		case gcNd, gcNl, gcNo:
			t[gc] = oN
		case gcZs, gcZl, gcZp:
			t[gc] = oS
		}
	}
	return t
}()

var o200kASCII = func() (t [utf8.RuneSelf]uint8) {
	for c := range t {
		r := rune(c)
		switch {
		case r == '\r' || r == '\n':
			t[c] = oS | oNL
		case r == ' ' || r >= '\t' && r <= '\r':
			t[c] = oS
		default:
			t[c] = o200kGC[gcOf(r)]
		}
	}
	return t
}()

// o200kAt returns the bits of the character at s[i:] and its width.
func o200kAt(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return o200kASCII[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	if r == 0x85 {
		return oS, w
	}
	return o200kGC[gcOf(r)], w
}

// o200kRun returns the end of the run of characters having any of bits.
func o200kRun(s string, i int, bits uint8) int {
	for i < len(s) {
		b, w := o200kAt(s, i)
		if b&bits == 0 {
			break
		}
		i += w
	}
	return i
}

// o200kContraction extends end over an optional (?i:'s|'t|...) suffix.
func o200kContraction(s string, end int) int {
	if end+1 < len(s) && s[end] == '\'' {
		if e := contraction(s, end+1, true); e > 0 {
			return e
		}
	}
	return end
}

// o200kWord1 matches [U]*[W]+C? at j, returning its end or -1.
func o200kWord1(s string, j int) int {
	e := o200kRun(s, j, oU)
	if w := o200kRun(s, e, oW); w > e {
		return o200kContraction(s, w)
	}
	// Give back U characters until one of them is also a W.
	for k := e; k > j; {
		r, wr := utf8.DecodeLastRuneInString(s[j:k])
		k -= wr
		if b, _ := o200kAt(s, k); b&oW != 0 {
			_ = r
			return o200kContraction(s, k+wr)
		}
	}
	return -1
}

// o200kWord2 matches [U]+[W]*C? at j, returning its end or -1.
func o200kWord2(s string, j int) int {
	e := o200kRun(s, j, oU)
	if e == j {
		return -1
	}
	return o200kContraction(s, o200kRun(s, e, oW))
}

func nextPieceO200k(s string, i int) int {
	b0, w0 := o200kAt(s, i)
	prefix := b0&(oL|oN|oNL) == 0 && i+w0 < len(s)
	if prefix {
		if e := o200kWord1(s, i+w0); e > 0 {
			return e
		}
	}
	if e := o200kWord1(s, i); e > 0 {
		return e
	}
	if prefix {
		if e := o200kWord2(s, i+w0); e > 0 {
			return e
		}
	}
	if e := o200kWord2(s, i); e > 0 {
		return e
	}
	// \p{N}{1,3}
	if b0&oN != 0 {
		e := i
		for k := 0; k < 3 && e < len(s); k++ {
			b, w := o200kAt(s, e)
			if b&oN == 0 {
				break
			}
			e += w
		}
		return e
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n/]*
	const notOther = oS | oL | oN
	start := -1
	if b0&notOther == 0 {
		start = i
	} else if s[i] == ' ' && i+1 < len(s) {
		if b1, _ := o200kAt(s, i+1); b1&notOther == 0 {
			start = i + 1
		}
	}
	if start >= 0 {
		e := start
		for e < len(s) {
			b, w := o200kAt(s, e)
			if b&notOther != 0 {
				break
			}
			e += w
		}
		for e < len(s) && (s[e] == '\r' || s[e] == '\n' || s[e] == '/') {
			e++
		}
		return e
	}
	return whitespace(s, i, true)
}
