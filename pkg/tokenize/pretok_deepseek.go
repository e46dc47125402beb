package tokenize

import "unicode/utf8"

// DeepSeek-V3's pre-tokenizer is a sequence of three Isolated splits (each
// keeps its matches and the unmatched text between them as pieces):
//
//  1. \p{N}{1,3}
//  2. [\x{4e00}-\x{9fa5}\x{3040}-\x{309f}\x{30a0}-\x{30ff}]+ (CJK runs)
//  3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//     ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// each applied to the pieces of the one before. nextPieceDeepSeek scans
// them in one pass: a number piece is up to three \p{N}; otherwise the piece
// lies inside a segment of CJK or of non-CJK, non-number text (split 2's
// and split 1's pieces), and pattern 3 runs bounded by that segment: no
// run crosses its end and (?!\S) sees its end as the end of the text.
// Characters where pattern 3 matches nowhere form one piece until the next
// match or the segment's end.

const (
	patternDeepSeekNum = `\p{N}{1,3}`
	patternDeepSeekCJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	patternDeepSeek3   = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// Character bits for the DeepSeek pattern.
const (
	dL   uint8 = 1 << iota // \p{L}
	dM                     // \p{M}
	dN                     // \p{N}
	dPS                    // \p{P} or \p{S}
	dS                     // \s
	dCJK                   // in split 2's ranges
	dNL                    // \r or \n
)

var dsGC = func() (t [32]uint8) {
	for gc := range t {
		switch uint8(gc) {
		case gcLu, gcLl, gcLt, gcLm, gcLo:
			t[gc] = dL
		case gcMn, gcMc, gcMe:
			t[gc] = dM
		case gcNd, gcNl, gcNo:
			t[gc] = dN
		case gcPc, gcPd, gcPs, gcPe, gcPi, gcPf, gcPo, gcSm, gcSc, gcSk, gcSo:
			t[gc] = dPS
		case gcZs, gcZl, gcZp:
			t[gc] = dS
		}
	}
	return t
}()

var dsASCII = func() (t [utf8.RuneSelf]uint8) {
	for c := range t {
		r := rune(c)
		switch {
		case r == '\r' || r == '\n':
			t[c] = dS | dNL
		case r == ' ' || r >= '\t' && r <= '\r':
			t[c] = dS
		default:
			t[c] = dsGC[gcOf(r)]
		}
	}
	return t
}()

func dsAt(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return dsASCII[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	switch {
	case r == 0x85:
		return dS, w
	case r >= 0x4e00 && r <= 0x9fa5 || r >= 0x3040 && r <= 0x30ff:
		return dsGC[gcOf(r)] | dCJK, w
	}
	return dsGC[gcOf(r)], w
}

// dsSeg is the segment kind a piece lies in: CJK or other (non-number).
type dsSeg struct{ cjk bool }

// at returns the bits and width of the character at i, ok false at the end
// of the text or of the segment.
func (g dsSeg) at(s string, i int) (b uint8, w int, ok bool) {
	if i >= len(s) {
		return 0, 0, false
	}
	b, w = dsAt(s, i)
	if g.cjk {
		return b, w, b&dCJK != 0
	}
	return b, w, b&(dCJK|dN) == 0
}

// run returns the end of the run of in-segment characters having any of bits.
func (g dsSeg) run(s string, i int, bits uint8) int {
	for {
		b, w, ok := g.at(s, i)
		if !ok || b&bits == 0 {
			return i
		}
		i += w
	}
}

func isASCIIPunct(c byte) bool {
	return c >= '!' && c <= '/' || c >= ':' && c <= '@' || c >= '[' && c <= '`' || c >= '{' && c <= '~'
}

// match tries pattern 3's alternatives at i (in segment), returning the
// end of the match or -1.
func (g dsSeg) match(s string, i int) int {
	b0, w0, _ := g.at(s, i)
	b1, w1, ok1 := g.at(s, i+w0)
	// [!"#...~][A-Za-z]+
	if isASCIIPunct(s[i]) && ok1 && isASCIILetter(s[i+1]) {
		e := i + 2
		for e < len(s) && isASCIILetter(s[e]) {
			e++
		}
		return e
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if b0&(dL|dPS|dNL) == 0 && ok1 && b1&(dL|dM) != 0 {
		return g.run(s, i+w0+w1, dL|dM)
	}
	if b0&(dL|dM) != 0 {
		return g.run(s, i+w0, dL|dM)
	}
	//  ?[\p{P}\p{S}]+[\r\n]*
	start := -1
	if b0&dPS != 0 {
		start = i
	} else if s[i] == ' ' && ok1 && b1&dPS != 0 {
		start = i + 1
	}
	if start >= 0 {
		e := g.run(s, start, dPS)
		for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
			e++
		}
		return e
	}
	if b0&dS == 0 {
		return -1
	}
	// \s*[\r\n]+ | \s+(?!\S) | \s+
	e, lastNL, last := i, -1, i
	for {
		b, w, ok := g.at(s, e)
		if !ok || b&dS == 0 {
			break
		}
		if b&dNL != 0 {
			lastNL = e + w
		}
		last = e
		e += w
	}
	if lastNL > 0 {
		return lastNL
	}
	if _, _, ok := g.at(s, e); !ok || last == i {
		return e
	}
	return last
}

func nextPieceDeepSeek(s string, i int) int {
	b0, w0 := dsAt(s, i)
	if b0&dN != 0 && b0&dCJK == 0 {
		e := i + w0
		for k := 1; k < 3 && e < len(s); k++ {
			b, w := dsAt(s, e)
			if b&dN == 0 || b&dCJK != 0 {
				break
			}
			e += w
		}
		return e
	}
	g := dsSeg{cjk: b0&dCJK != 0}
	if e := g.match(s, i); e > i {
		return e
	}
	// Unmatched: up to the next match or the segment's end.
	j := i + w0
	for {
		_, w, ok := g.at(s, j)
		if !ok || g.match(s, j) > j {
			return j
		}
		j += w
	}
}
