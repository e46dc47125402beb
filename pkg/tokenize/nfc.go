package tokenize

import (
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// cgj is U+034F COMBINING GRAPHEME JOINER, which golang.org/x/text's
// normalizer inserts after every 30 consecutive non-starters (the
// Stream-Safe Text Format, UAX #15). The reference normalizer (Rust
// unicode-normalization, as HuggingFace tokenizers uses it) implements
// plain NFC and inserts nothing, and the CGJ also blocks reordering and
// composition across it. So when the fast path inserted one, the text is
// normalized again by nfcExact, which follows the standard algorithm
// without the stream-safe step.
const cgj = "\u034f"

// nfc returns the NFC form of s exactly as UAX #15 defines it (no
// stream-safe insertions).
func nfc(s string) string {
	i := asciiPrefix(s)
	if i == len(s) {
		return s
	}
	if nfcQuick(s, i) {
		return s
	}
	out := norm.NFC.String(s)
	if strings.Contains(out, cgj) && strings.Count(out, cgj) != strings.Count(s, cgj) {
		return nfcExact(s)
	}
	return out
}

// nfcExact is NFC by the book: full canonical decomposition, canonical
// ordering of each run of non-starters (stable by combining class), then
// canonical composition. Decomposition and pair composition use x/text's
// tables one code point or pair at a time, where stream-safety never
// applies. It is the slow path, taken only for runs of more than 30
// combining marks.
func nfcExact(s string) string {
	// Decompose.
	rs := make([]rune, 0, len(s))
	var buf [utf8.UTFMax]byte
	for _, r := range s {
		n := utf8.EncodeRune(buf[:], r)
		if norm.NFD.IsNormal(buf[:n]) {
			rs = append(rs, r)
			continue
		}
		for _, d := range norm.NFD.String(string(r)) {
			rs = append(rs, d)
		}
	}
	ccc := make([]uint8, len(rs))
	for i, r := range rs {
		ccc[i] = cccOf(r)
	}
	// Canonical ordering: stable sort of each run of non-starters.
	for i := 0; i < len(rs); {
		if ccc[i] == 0 {
			i++
			continue
		}
		j := i
		for j < len(rs) && ccc[j] != 0 {
			j++
		}
		idx := make([]int, j-i)
		for k := range idx {
			idx[k] = i + k
		}
		slices.SortStableFunc(idx, func(a, b int) int { return int(ccc[a]) - int(ccc[b]) })
		run := make([]rune, len(idx))
		runC := make([]uint8, len(idx))
		for k, x := range idx {
			run[k], runC[k] = rs[x], ccc[x]
		}
		copy(rs[i:j], run)
		copy(ccc[i:j], runC)
		i = j
	}
	// Canonical composition.
	out := rs[:0:0]
	outC := []uint8{}
	starter := -1 // index in out of the last starter, or -1
	for i, r := range rs {
		c := ccc[i]
		if starter >= 0 {
			last := outC[len(outC)-1]
			blocked := len(out)-1 != starter && (last == 0 || last >= c)
			if !blocked {
				if p, ok := composePair(out[starter], r); ok {
					out[starter] = p
					outC[starter] = cccOf(p)
					continue
				}
			}
		}
		if c == 0 {
			starter = len(out)
		}
		out = append(out, r)
		outC = append(outC, c)
	}
	return string(out)
}

func cccOf(r rune) uint8 {
	var buf [utf8.UTFMax]byte
	n := utf8.EncodeRune(buf[:], r)
	return norm.NFD.Properties(buf[:n]).CCC()
}

// composePair returns the primary composite of a and b, if any.
func composePair(a, b rune) (rune, bool) {
	s := norm.NFC.String(string([]rune{a, b}))
	r, n := utf8.DecodeRuneInString(s)
	if n == len(s) && r != a {
		return r, true
	}
	return 0, false
}

// asciiPrefix is the length of s's leading run of ASCII bytes, eight at a
// time (norm's quick check looks each byte up in its tables: NFC was ≈15%
// of cold encoding, mostly on ASCII).
func asciiPrefix(s string) int {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		if w&0x8080808080808080 != 0 {
			break
		}
	}
	for i < len(s) && s[i] < 0x80 {
		i++
	}
	return i
}

// nfcQuick reports whether s, whose first i bytes are ASCII, is in NFC.
//
// ASCII characters and stable ones (nfcStableTable) are in NFC and begin a
// segment: nothing before such a character composes or reorders with it
// or with what follows it. So s is in NFC when the span from the last
// ASCII or stable character before its first other character (which may
// compose with it) to the next ASCII or stable character after its last
// other character is: norm checks that span only, once (it allocates when
// its own quick check is not enough), and nothing at all when every
// character is ASCII or stable. An invalid byte sends the rest to norm.
func nfcQuick(s string, i int) bool {
	last := max(i-1, 0)
	lo, hi := -1, -1 // the span norm checks
	stable := nfcStableTable()
	isStable := func(j int) (n int, ok bool) {
		if c := s[j]; c < utf8.RuneSelf {
			return 1, true
		}
		r, n := utf8.DecodeRuneInString(s[j:])
		return n, n > 1 && r < nfcStableLimit && stable[r>>6]&(1<<(r&63)) != 0
	}
	for i < len(s) {
		n, ok := isStable(i)
		if ok {
			last = i
			i += n
			continue
		}
		if lo < 0 {
			lo = last
		}
		if n == 1 { // invalid UTF-8
			return norm.NFC.IsNormalString(s[lo:])
		}
		i += n
		for i < len(s) {
			n, ok := isStable(i)
			if ok || n == 1 {
				break
			}
			i += n
		}
		hi = i
	}
	return lo < 0 || norm.NFC.IsNormalString(s[lo:hi])
}

// nfcStableLimit bounds the code points nfcStableTable covers: the Basic
// Multilingual Plane, the supplementary planes of symbols, emoji and
// historic scripts (1) and of CJK ideographs (2). Code points above are
// left to norm.
const nfcStableLimit = 0x30000

// nfcStableTable is a bit per code point below nfcStableLimit, set for
// the stable ones: a starter (combining class 0) that is in NFC by itself
// (NFC_Quick_Check is not No) and cannot combine with a character before
// it (not Maybe). A text of such characters is in NFC (UAX #15's quick
// check answers Yes), and nothing before one of them composes or reorders
// with what follows it. Built once, on first use, from norm's tables
// (≈ 24 KB): the scan over CJK, Cyrillic, Greek or emoji text then costs
// a UTF-8 decode and a bit test per character instead of norm's quick
// check (NFC was ≈ 10% of a cold mixed-script prompt's CPU).
var nfcStableTable = sync.OnceValue(func() []uint64 {
	t := make([]uint64, nfcStableLimit/64)
	for r := rune(0); r < nfcStableLimit; r++ {
		if nfcStable(r) {
			t[r>>6] |= 1 << (r & 63)
		}
	}
	return t
})

// nfcStable reports whether r is a stable character (see nfcStableTable),
// by norm's own answers for it.
func nfcStable(r rune) bool {
	if !utf8.ValidRune(r) {
		return false
	}
	var buf [utf8.UTFMax]byte
	b := buf[:utf8.EncodeRune(buf[:], r)]
	p := norm.NFC.Properties(b)
	return p.CCC() == 0 && p.BoundaryBefore() && norm.NFC.IsNormal(b)
}
