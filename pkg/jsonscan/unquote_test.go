package jsonscan

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestValidUTF8 compares ValidUTF8 with utf8.Valid on every sequence of
// up to three bytes drawn from the bytes where UTF-8's rules change
// (ASCII, continuation ranges, every kind of lead byte), each alone, after
// eight ASCII bytes (the skip) and before a four-byte character, and on
// random byte strings.
func TestValidUTF8(t *testing.T) {
	edges := []byte{0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xe1, 0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5, 0xff}
	check := func(b []byte) {
		for _, x := range [][]byte{b, append([]byte("12345678"), b...), append(append([]byte{}, b...), "\xf0\x9f\x9a\x80"...)} {
			if got, want := ValidUTF8(x), utf8.Valid(x); got != want {
				t.Fatalf("% x: ValidUTF8 %v, utf8.Valid %v", x, got, want)
			}
		}
	}
	for _, a := range edges {
		check([]byte{a})
		for _, b := range edges {
			check([]byte{a, b})
			for _, c := range edges {
				check([]byte{a, b, c})
				for _, d := range []byte{0x41, 0x80, 0xbf, 0xc0} {
					check([]byte{a, b, c, d})
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	valid := 0
	for range 20000 {
		b := []byte(string([]rune{rune(rng.IntN(0x110000)), rune(rng.IntN(0x800)), 'x'}))
		if rng.IntN(2) == 0 {
			b[rng.IntN(len(b))] = byte(rng.IntN(256))
		}
		check(b)
		if utf8.Valid(b) {
			valid++
		}
	}
	if valid < 5000 || valid > 19000 {
		t.Fatalf("%d of 20000 random strings valid: the mix does not test both outcomes", valid)
	}
}

// TestValidUTF8Halves: texts of 64 bytes and more, validated as two
// halves cut at a character's first byte, agree with utf8.Valid when
// every edge byte sequence sits at each position around the middle (a
// character cut by the middle, a stray continuation byte there, a
// truncated sequence ending the first half), when the middle falls in a
// run of continuation bytes (no cut point), and on random mixed-script
// texts with one byte changed anywhere.
func TestValidUTF8Halves(t *testing.T) {
	edges := [][]byte{{0x80}, {0xbf}, {0xc2}, {0xe0, 0xa0}, {0xed, 0xa0}, {0xe1, 0x80}, {0xf0, 0x90, 0x80}, {0xf4, 0x90}, {0xf5}, {0xc0, 0x80},
		[]byte("é"), []byte("日"), []byte("🚀"), {0x80, 0x80, 0x80, 0x80, 0x80}}
	check := func(b []byte) {
		if got, want := ValidUTF8(b), utf8.Valid(b); got != want {
			t.Fatalf("% x: ValidUTF8 %v, utf8.Valid %v", b, got, want)
		}
	}
	for _, n := range []int{64, 65, 71, 72, 100, 257} {
		for _, fill := range []string{"a", "é", "日", "🚀"} {
			base := []byte(strings.Repeat(fill, n)[:n])
			for _, e := range edges {
				for at := n/2 - 6; at <= n/2+6; at++ {
					b := append([]byte{}, base...)
					copy(b[at:], e)
					check(b)
					check(append(append([]byte{}, base[:at]...), e...))
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	scripts := []rune{'a', 'é', 'ж', '日', '🚀', '́'}
	valid := 0
	for range 5000 {
		var sb strings.Builder
		for n := 20 + rng.IntN(300); n > 0; n-- {
			sb.WriteRune(scripts[rng.IntN(len(scripts))] + rune(rng.IntN(3)))
		}
		b := []byte(sb.String())
		if rng.IntN(2) == 0 {
			b[rng.IntN(len(b))] = byte(rng.IntN(256))
		}
		check(b)
		if utf8.Valid(b) {
			valid++
		}
	}
	if valid < 2500 || valid > 4500 {
		t.Fatalf("%d of 5000 random texts valid: the mix does not test both outcomes", valid)
	}
}

// FuzzValidUTF8: ValidUTF8 agrees with utf8.Valid.
func FuzzValidUTF8(f *testing.F) {
	f.Add([]byte("caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x9a\x80 \xed\xa0\x80"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := ValidUTF8(b), utf8.Valid(b); got != want {
			t.Fatalf("% x: ValidUTF8 %v, utf8.Valid %v", b, got, want)
		}
	})
}
