package tokenize

import (
	"slices"
	"strings"
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
	// ASCII is in NFC and every ASCII character is a starter, so nothing
	// before the prefix's last character can compose or reorder with what
	// follows it: the whole is normal when the rest from that character is.
	if norm.NFC.IsNormalString(s[max(i-1, 0):]) {
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
