package jsonscan

import (
	"bytes"
	"encoding/binary"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// msb has the high bit of each of eight bytes.
const msb = 0x8080808080808080

// Unquote decodes a JSON string's raw bytes (between its quotes, already
// checked to be a well-formed string: escapes complete, no control
// character) exactly as encoding/json does: escapes decoded, each byte of
// an invalid UTF-8 sequence replaced by U+FFFD. complex is false when raw
// holds no escape and is valid UTF-8 (then it is copied as it is).
func Unquote(raw []byte, complex bool) string {
	if !complex {
		return string(raw)
	}
	out := make([]byte, 0, len(raw)+8)
	// Escapes are ASCII, so the text between them is valid UTF-8 exactly
	// when all of raw is: one check of the whole string (ValidUTF8 runs
	// two chains on long ones) instead of one per piece.
	valid := ValidUTF8(raw)
	for r := 0; r < len(raw); {
		// The text up to the next escape.
		j := bytes.IndexByte(raw[r:], '\\')
		if j < 0 {
			j = len(raw)
		} else {
			j += r
		}
		if valid {
			out = append(out, raw[r:j]...)
		} else {
			out = appendUTF8(out, raw[r:j])
		}
		if r = j; r == len(raw) {
			break
		}
		switch raw[r+1] {
		case '"', '\\', '/':
			out = append(out, raw[r+1])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			rr := hex4(raw[r+2 : r+6])
			r += 6
			if utf16.IsSurrogate(rr) {
				if r+6 <= len(raw) && raw[r] == '\\' && raw[r+1] == 'u' {
					if dec := utf16.DecodeRune(rr, hex4(raw[r+2:r+6])); dec != unicode.ReplacementChar {
						out = utf8.AppendRune(out, dec)
						r += 6
						continue
					}
				}
				rr = unicode.ReplacementChar
			}
			out = utf8.AppendRune(out, rr)
			continue
		}
		r += 2
	}
	// out is never written again: hand it over without a second copy, as
	// strings.Builder does.
	return unsafe.String(unsafe.SliceData(out), len(out))
}

// appendUTF8 appends text, each byte of an invalid UTF-8 sequence replaced
// by U+FFFD (as encoding/json decodes it).
func appendUTF8(out, text []byte) []byte {
	if ValidUTF8(text) {
		return append(out, text...)
	}
	for len(text) > 0 {
		rr, size := utf8.DecodeRune(text)
		if rr == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, text[:size]...)
		}
		text = text[size:]
	}
	return out
}

// ValidUTF8 is utf8.Valid as a shift-based DFA: one table load and one
// shift per byte, no branch on the character's length, and eight ASCII
// bytes at a time between characters. On text that mixes scripts (most
// characters of 2, 3 and 4 bytes in no order) utf8.Valid's branches
// mispredict on nearly every character; it was 60% of parsing the
// 100k-token fixture chat.
//
// Each step waits for the one before it (the state is the shift), so a
// text of 64 bytes or more is cut in two at a character's first byte and
// the halves run as two independent chains in one loop, which the CPU
// overlaps. UTF-8 synchronizes at every byte that is not a continuation
// byte: the text is valid exactly when both halves are (the first one
// must end on a whole character).
func ValidUTF8(b []byte) bool {
	if len(b) >= 64 {
		m := len(b) / 2
		for k := 0; k < 3 && b[m]&0xC0 == 0x80; k++ {
			m--
		}
		if b[m]&0xC0 != 0x80 {
			return validUTF8Pair(b[:m], b[m:])
		}
	}
	return utf8DFARun(b, 0) == dfaAccept
}

// validUTF8Pair is ValidUTF8 of a and b, which must each be valid on its
// own, run side by side.
func validUTF8Pair(a, b []byte) bool {
	sa, sb := uint64(0), uint64(0)
	i := 0
	for ; i+8 <= len(a) && i+8 <= len(b); i += 8 {
		ca, cb := a[i:i+8:i+8], b[i:i+8:i+8]
		if (sa|sb)&63 == 0 && (binary.LittleEndian.Uint64(ca)|binary.LittleEndian.Uint64(cb))&msb == 0 {
			continue
		}
		sa = utf8DFA[ca[0]] >> (sa & 63)
		sb = utf8DFA[cb[0]] >> (sb & 63)
		sa = utf8DFA[ca[1]] >> (sa & 63)
		sb = utf8DFA[cb[1]] >> (sb & 63)
		sa = utf8DFA[ca[2]] >> (sa & 63)
		sb = utf8DFA[cb[2]] >> (sb & 63)
		sa = utf8DFA[ca[3]] >> (sa & 63)
		sb = utf8DFA[cb[3]] >> (sb & 63)
		sa = utf8DFA[ca[4]] >> (sa & 63)
		sb = utf8DFA[cb[4]] >> (sb & 63)
		sa = utf8DFA[ca[5]] >> (sa & 63)
		sb = utf8DFA[cb[5]] >> (sb & 63)
		sa = utf8DFA[ca[6]] >> (sa & 63)
		sb = utf8DFA[cb[6]] >> (sb & 63)
		sa = utf8DFA[ca[7]] >> (sa & 63)
		sb = utf8DFA[cb[7]] >> (sb & 63)
	}
	return utf8DFARun(a[i:], sa) == dfaAccept && utf8DFARun(b[i:], sb) == dfaAccept
}

// utf8DFARun runs the DFA over b from state st (its low 6 bits) and
// returns the state after it.
func utf8DFARun(b []byte, st uint64) uint64 {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		c := b[i : i+8 : i+8]
		if st&63 == 0 && binary.LittleEndian.Uint64(c)&msb == 0 {
			continue
		}
		// Eight steps, no branch: the next state depends only on the
		// table row of the byte and the state before. The state is the
		// low 6 bits; the bits above are left over from the row and
		// ignored (x86 shifts use only the count's low 6 bits, so the
		// mask costs nothing and each step is one shift on the chain).
		st = utf8DFA[c[0]] >> (st & 63)
		st = utf8DFA[c[1]] >> (st & 63)
		st = utf8DFA[c[2]] >> (st & 63)
		st = utf8DFA[c[3]] >> (st & 63)
		st = utf8DFA[c[4]] >> (st & 63)
		st = utf8DFA[c[5]] >> (st & 63)
		st = utf8DFA[c[6]] >> (st & 63)
		st = utf8DFA[c[7]] >> (st & 63)
	}
	for ; i < len(b); i++ {
		st = utf8DFA[b[i]] >> (st & 63)
	}
	return st & 63
}

// The DFA's states are bit offsets into a row (multiples of 6): accept,
// error (sticky), and the states waiting for continuation bytes.
const (
	dfaAccept = 0
	dfaError  = 6
	dfaCont1  = 12 // one more byte 80..BF
	dfaCont2  = 18 // two more, the next 80..BF
	dfaE0     = 24 // after E0: A0..BF, then one
	dfaED     = 30 // after ED: 80..9F, then one
	dfaF0     = 36 // after F0: 90..BF, then two
	dfaF1     = 42 // after F1..F3: 80..BF, then two
	dfaF4     = 48 // after F4: 80..8F, then two
)

// utf8DFA[c] holds, at each state's offset, the state c leads to.
var utf8DFA = func() (t [256]uint64) {
	set := func(c int, from, to uint64) { t[c] = t[c]&^(63<<from) | to<<from }
	for c := range 256 {
		for st := uint64(0); st <= dfaF4; st += 6 {
			set(c, st, dfaError)
		}
		switch {
		case c < 0x80:
			set(c, dfaAccept, dfaAccept)
		case c < 0xC0: // continuation
			set(c, dfaCont1, dfaAccept)
			set(c, dfaCont2, dfaCont1)
			set(c, dfaF1, dfaCont2)
			if c < 0xA0 {
				set(c, dfaED, dfaCont1)
			} else {
				set(c, dfaE0, dfaCont1)
			}
			if c >= 0x90 {
				set(c, dfaF0, dfaCont2)
			} else {
				set(c, dfaF4, dfaCont2)
			}
		case c >= 0xC2 && c <= 0xDF:
			set(c, dfaAccept, dfaCont1)
		case c == 0xE0:
			set(c, dfaAccept, dfaE0)
		case c == 0xED:
			set(c, dfaAccept, dfaED)
		case c >= 0xE1 && c <= 0xEF:
			set(c, dfaAccept, dfaCont2)
		case c == 0xF0:
			set(c, dfaAccept, dfaF0)
		case c >= 0xF1 && c <= 0xF3:
			set(c, dfaAccept, dfaF1)
		case c == 0xF4:
			set(c, dfaAccept, dfaF4)
		}
	}
	return t
}()

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		default:
			c = c - 'A' + 10
		}
		r = r<<4 | rune(c)
	}
	return r
}
