package jsonscan

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// skipAll reads b as one JSON text with Skip and End.
func skipAll(b []byte) error {
	s := New(b)
	err := s.Skip(0)
	if err == nil {
		err = s.End()
	}
	return err
}

// sameError reports how err (the scanner's) differs from encoding/json's
// verdict on the same text, "" when it does not: both nil, or syntax
// errors at the same offset with the same message.
func sameError(b []byte, err error) string {
	var v json.RawMessage // checked, not decoded: a number too large for a float64 is still valid
	werr := json.Unmarshal(b, &v)
	if err == nil && werr == nil {
		return ""
	}
	var se *SyntaxError
	var wse *json.SyntaxError
	if !errors.As(err, &se) || !errors.As(werr, &wse) || se.Offset != int(wse.Offset) || se.Msg != wse.Error() {
		return fmt.Sprintf("scanner %v, encoding/json %v (offset %v)", err, werr, offsetOf(wse))
	}
	return ""
}

func offsetOf(e *json.SyntaxError) any {
	if e == nil {
		return nil
	}
	return e.Offset
}

// TestSkipAsEncodingJSON: Skip accepts exactly what encoding/json
// accepts, nesting bound included, and refuses the rest with
// encoding/json's error: the same offset, the same words.
func TestSkipAsEncodingJSON(t *testing.T) {
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	cases := []string{
		nest(MaxDepth), nest(MaxDepth + 1),
		`[` + strings.Repeat(`{"a":`, MaxDepth-1) + `1` + strings.Repeat(`}`, MaxDepth-1) + `]`,
		`[` + strings.Repeat(`{"a":`, MaxDepth) + `1` + strings.Repeat(`}`, MaxDepth) + `]`,
		`[{"\q":1}]`, `[{"\u12":1}]`, `[{"a\u00e9\ud800":1}]`, `[{"a" 1}]`, `[{"a":1,}]`, `[{,}]`, `[{1:2}]`,
		`[tru]`, `[true]`, `[nul]`, `[null, false]`, `[truex]`, `[1 2]`, `[1] x`, `[1] `, `[}]`, `[{]`, `[01]`, `[-]`, `[-0]`,
		`[1.]`, `[1.5e+3]`, `[1e]`, `[.5]`, `[+1]`, `["a` + "\x01" + `"]`, `["\ud83d\ude00", "\xff"]`, `["\`, `["`, `[`, `[,]`,
		`[1,]`, `[[],[[]],{}]`, ` [ 1 , "x" ] `, `["a"1]`, `[1"a"]`, `[{"a":1}{"b":2}]`, `[1,}`, `{"a":tru}`, `["\q"]`,
		``, ` `, `x`, "\xef\xbb\xbf{}", "\x00", "[\x7f]", "[\x85]", `'a'`, `"\u00e9`, `{"a":1 "b":2}`, `{"a"}`, `-01`, `1e+x`,
		`[1.5.2]`, `"a\u12G4"`, `{"a":[}`, `[nulL]`, `[falsE]`,
	}
	for _, c := range cases {
		if d := sameError([]byte(c), skipAll([]byte(c))); d != "" {
			t.Errorf("%.60q: %s", c, d)
		}
	}
}

// TestStringAtEveryAlignment: a string's special bytes (its closing quote,
// an escape, a control character) and its non-ASCII bytes are found at
// every offset within the scan's eight-byte words, before and after the
// scan takes a run as long: what a string decodes to, where it ends, and
// how it is refused, are encoding/json's.
func TestStringAtEveryAlignment(t *testing.T) {
	for _, x := range []string{``, `\n`, `\"`, `\u00e9`, `\ud83d\ude00`, `\ud800`, "\x01", "\x1f", `\q`, `\u12`, "\xff", "\xc3\xa9", "\xe2\x82", "é\x80", "\x7f", " ", `\`} {
		for pre := 0; pre < 80; pre++ {
			for post := 0; post < 80; post += 7 {
				for _, tail := range []string{`]`, `,"\u00e9"]`, ",\"\xff\xfe\"]", ``} {
					in := []byte(`["` + strings.Repeat("a", pre) + x + strings.Repeat("b", post) + `"` + tail)
					if d := sameError(in, skipAll(in)); d != "" {
						t.Fatalf("%q: %s", in, d)
					}
					var want []string
					if json.Unmarshal(in, &want) != nil {
						continue
					}
					var got []string
					s := New(in)
					s.Peek()
					if err := s.Array(func(int) error {
						v, err := s.Text()
						got = append(got, v)
						return err
					}); err != nil {
						t.Fatalf("%q: %v", in, err)
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("%q: scanner %q, encoding/json %q", in, got, want)
					}
				}
			}
		}
	}
}

// TestStringsAsEncodingJSON: random strings of plain runs of every length
// up to past where the scan takes a run as long, multi-byte and invalid
// bytes, every escape (a quote escaped just before the real one
// included), malformed escapes, control characters and missing closing
// quotes, each followed by more JSON: the scanner ends each where
// encoding/json does, decodes it as encoding/json does, and refuses the
// malformed ones at encoding/json's offset with its message.
func TestStringsAsEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	pieces := []string{`\"`, `\\`, `\/`, `\n`, `\t`, `\u00e9`, `\ud83d\ude80`, "é", "中", "🚀", "\xff", "\xe4\xb8",
		`\x`, `\u12`, `\u12g4`, "\x01", "\x1f", "\x7f", `\`, `"`, `\\"`}
	for range 30000 {
		var sb strings.Builder
		sb.WriteString(`["`)
		for range rng.IntN(8) {
			sb.WriteString(strings.Repeat("ab", rng.IntN(30)))
			if rng.IntN(3) > 0 {
				sb.WriteString(pieces[rng.IntN(len(pieces))])
			}
		}
		switch rng.IntN(4) {
		case 0: // no closing quote
		case 1:
			sb.WriteString(`\`)
		default:
			sb.WriteString(`", "x"]`)
		}
		b := []byte(sb.String())
		if d := sameError(b, skipAll(b)); d != "" {
			t.Fatalf("%q: %s", b, d)
		}
		var want []string
		if json.Unmarshal(b, &want) != nil {
			continue
		}
		s := New(b)
		s.Peek()
		s.Enter()
		raw, complex, err := s.RawString()
		if err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		if got := Unquote(raw, complex); got != want[0] || !complex && string(raw) != want[0] {
			t.Fatalf("%q: %q (complex %v), encoding/json %q", b, got, complex, want[0])
		}
		if !s.Comma() || s.Peek() != '"' {
			t.Fatalf("%q: the string ends at %d", b, s.Pos())
		}
	}
}

// TestUnquoteMatchesEncodingJSON: invalid UTF-8 next to escapes (a
// truncated sequence before one, a stray continuation byte after one,
// a lone surrogate escape between invalid bytes), long runs for the
// eight-byte step, and valid text: Unquote gives what encoding/json gives.
func TestUnquoteMatchesEncodingJSON(t *testing.T) {
	long := strings.Repeat("eight by", 5)
	for _, s := range []string{
		"\"caf\xc3\\u00a9\"", "\"\\u00e9\xa9\"", "\"\xe4\xb8\\n\xad\"", "\"\\ud800\xff\\udc00\"", "\"" + long + "\xc3\\\\" + long + "\"",
		"\"" + long + "\\u4e2d\xe4\xb8\xad" + long + "\\t\"", "\"\\\"" + long + "\xf0\x9f\x9a\x80\\/\"", "\"\xed\xa0\x80\\u0041\"",
		"\"a\\u00\xe4\xb8\xad\"", "\"\xef\xbf\xbd\\ufffd\xff\"",
	} {
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			continue // not a string encoding/json accepts: the scanner's business, not Unquote's
		}
		sc := New([]byte(s))
		raw, complex, err := sc.RawString()
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if got := Unquote(raw, complex); got != want {
			t.Fatalf("%q: Unquote %q, encoding/json %q", s, got, want)
		}
	}
}

// TestUnquoteRandomMatchesEncodingJSON: random valid strings built of
// ASCII runs of every length (so that escapes fall at every offset of the
// eight-byte copy), multi-byte characters and every kind of escape
// (surrogate pairs, unpaired and reversed surrogates included), decoded
// like encoding/json decodes them.
func TestUnquoteRandomMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pieces := []string{`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u0041`, `\u00e9`, `\u4e2d`, `\ud83d\ude80`,
		`\ud800`, `\udc00`, `\udc00\ud800`, `\ud800\u0041`, `\u0000`, "é", "中", "🚀", "\u2028"}
	for range 20000 {
		var sb strings.Builder
		sb.WriteByte('"')
		for range rng.IntN(12) {
			sb.WriteString(strings.Repeat("x", rng.IntN(20)))
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		sb.WriteString(strings.Repeat("y", rng.IntN(10)))
		sb.WriteByte('"')
		s := sb.String()
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		sc := New([]byte(s))
		got, err := sc.Text()
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if got != want {
			t.Fatalf("%q: Text %q, encoding/json %q", s, got, want)
		}
	}
}

// intAsEncodingJSON reports how Int and Uint differ on b, a JSON text,
// from encoding/json decoding it into an int64 and a uint64, "" when they
// do not: the same value, or both refusing it.
func intAsEncodingJSON(b []byte) string {
	s := New(b)
	if c := s.Peek(); c != '-' && (c < '0' || c > '9') {
		return ""
	}
	start := s.Pos()
	v, ok, err := s.Int()
	lit := s.Input()[start:s.Pos()]
	if err == nil {
		err = s.End()
	}
	var want int64
	werr := json.Unmarshal(b, &want)
	if (err == nil && ok) != (werr == nil) || werr == nil && v != want || err == nil && string(lit) != strings.TrimSpace(string(b)) {
		return fmt.Sprintf("Int %q %d %v %v, encoding/json %d %v", lit, v, ok, err, want, werr)
	}
	// Uint takes the plain ones: encoding/json's uint64s written with
	// no sign in at most 19 digits.
	s = New(b)
	s.Peek()
	u, uok := s.Uint()
	uok = uok && s.End() == nil
	var wantU uint64
	plain := json.Unmarshal(b, &wantU) == nil && !strings.Contains(string(b), "-") && len(strings.TrimSpace(string(b))) <= 19
	if uok != plain || uok && u != wantU {
		return fmt.Sprintf("Uint %d %v, encoding/json %d (plain %v)", u, uok, wantU, plain)
	}
	return ""
}

// TestIntAsEncodingJSON: Int takes exactly the integers encoding/json
// decodes into an int64, with their values, at and around its bounds, and
// Uint the plain ones it decodes into a uint64.
func TestIntAsEncodingJSON(t *testing.T) {
	for _, c := range []string{"0", "-0", "7", "-7", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
		"-9223372036854775809", "12345678901234567890", "99999999999999999999", "1.0", "1e3", "1E+2", "-", "01", "00", "-01",
		" 42 ", "4294967296", "1.", "0e", "-a", "1x", "9999999999999999999", "10000000000000000000", "18446744073709551615"} {
		if d := intAsEncodingJSON([]byte(c)); d != "" {
			t.Errorf("%q: %s", c, d)
		}
	}
}

// decode reads the value at the cursor into what encoding/json decodes
// it into (numbers as json.Number), with the walkers in turn: Object and
// Array at even depths, Enter, Key, Comma and Close at odd ones.
func decode(s *Scanner, depth int) (any, error) {
	switch c := s.Peek(); c {
	case '{':
		out := map[string]any{}
		if depth%2 == 0 {
			err := s.Object(depth+1, func(k string) (bool, error) {
				k = strings.Clone(k) // a view of the input, valid during the call
				v, err := decode(s, depth+1)
				out[k] = v
				return true, err
			})
			return out, err
		}
		for more := s.Enter(); more; more = s.Comma() {
			k, err := s.Key()
			if err != nil {
				return nil, err
			}
			if out[k], err = decode(s, depth+1); err != nil {
				return nil, err
			}
		}
		return out, s.Close('}')
	case '[':
		out := []any{}
		if depth%2 == 0 {
			err := s.Array(func(int) error {
				v, err := decode(s, depth+1)
				out = append(out, v)
				return err
			})
			return out, err
		}
		for more := s.Enter(); more; more = s.Comma() {
			v, err := decode(s, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, s.Close(']')
	case '"':
		return s.Text()
	case 'n':
		_, err := s.Null()
		return nil, err
	case 't', 'f':
		return c == 't', s.Literal(map[byte]string{'t': "true", 'f': "false"}[c])
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		lit, err := s.Number()
		return json.Number(lit), err
	}
	return nil, s.Skip(depth)
}

// FuzzScanner: the scanner accepts exactly what encoding/json accepts,
// refuses the rest with encoding/json's error (offset and words), and,
// through every walker, decodes values as encoding/json decodes them.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,2.5e-3,-0,true,false,null,"x\u00e9\n"],"b":{}}`, `"\ud800\udc00\ud800"`, `[01]`, `1.`, `-`, `"\x"`,
		"\"\xff\"", `{"a" 1}`, `[1,]`, ` {} `, `{}x`, `"a\u00"`, `[[[[]]]]`, `1e+`, `tru`, `{"a":{"b":[{"c":"d"}]},"a":2}`,
		`"` + strings.Repeat("long plain text ", 8) + `\"` + strings.Repeat("é", 20) + "\x01\"",
		"2" + strings.Repeat("0", 400), "-9223372036854775808", "9223372036854775808",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := skipAll(b)
		if valid := json.Valid(b); valid != (err == nil) {
			t.Fatalf("%q: json.Valid %v, scanner error %v", b, valid, err)
		}
		if d := sameError(b, err); d != "" {
			t.Fatalf("%q: %s", b, d)
		}
		if err != nil {
			return
		}
		if d := intAsEncodingJSON(b); d != "" {
			t.Fatalf("%q: %s", b, d)
		}
		s := New(b)
		got, err := decode(&s, 0)
		if err == nil {
			err = s.End()
		}
		if err != nil {
			t.Fatalf("%q: Skip accepts it, the walkers fail: %v", b, err)
		}
		var want any
		d := json.NewDecoder(strings.NewReader(string(b)))
		d.UseNumber()
		if err := d.Decode(&want); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", want) {
			t.Fatalf("%q: scanner %#v, encoding/json %#v", b, got, want)
		}
	})
}
