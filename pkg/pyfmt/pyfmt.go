package pyfmt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// FloatRepr is Python's repr(float) for a finite f: the shortest digits
// that round-trip, in positional notation when the decimal exponent is in
// [-4, 16), with ".0" added to whole numbers; otherwise d.ddde±XX with at
// least two exponent digits.
func FloatRepr(f float64) string {
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	// Shortest round-trip digits and exponent: "-d.ddde±x".
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.Replace(mant, ".", "", 1)
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	// Python: decpt = exp+1; exponent form when decpt <= -4 or decpt > 16.
	decpt := exp + 1
	if decpt <= -4 || decpt > 16 {
		b.WriteByte(digits[0])
		if len(digits) > 1 {
			b.WriteByte('.')
			b.WriteString(digits[1:])
		}
		b.WriteByte('e')
		if exp < 0 {
			b.WriteByte('-')
			exp = -exp
		} else {
			b.WriteByte('+')
		}
		if exp < 10 {
			b.WriteByte('0')
		}
		b.WriteString(strconv.Itoa(exp))
		return b.String()
	}
	switch {
	case decpt <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -decpt))
		b.WriteString(digits)
	case decpt >= len(digits):
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", decpt-len(digits)))
		b.WriteString(".0")
	default:
		b.WriteString(digits[:decpt])
		b.WriteByte('.')
		b.WriteString(digits[decpt:])
	}
	return b.String()
}

// WriteStringRepr writes repr(s) as CPython's unicode_repr does: single
// quotes unless s holds a single quote and no double quote; backslash,
// the quote, \t, \n and \r escaped; other control characters and DEL as
// \xhh; a non-ASCII character kept when it is printable (str.isprintable:
// not in the Unicode categories C* or Z*, which is Go's unicode.IsPrint)
// and otherwise escaped as \xhh, \uhhhh or \Uhhhhhhhh.
func WriteStringRepr(b *strings.Builder, s string) {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	b.WriteByte(quote)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == quote || c == '\\':
				b.WriteByte('\\')
				b.WriteByte(c)
			case c == '\t':
				b.WriteString(`\t`)
			case c == '\n':
				b.WriteString(`\n`)
			case c == '\r':
				b.WriteString(`\r`)
			case c < ' ' || c == 0x7f:
				b.WriteString(`\x`)
				b.WriteString(hex2(uint32(c)))
			default:
				b.WriteByte(c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case unicode.IsPrint(r):
			b.WriteString(s[i : i+n])
		case r <= 0xff:
			b.WriteString(`\x`)
			b.WriteString(hex2(uint32(r)))
		case r <= 0xffff:
			b.WriteString(`\u`)
			b.WriteString(padHex(uint32(r), 4))
		default:
			b.WriteString(`\U`)
			b.WriteString(padHex(uint32(r), 8))
		}
		i += n
	}
	b.WriteByte(quote)
}

func hex2(v uint32) string { return padHex(v, 2) }

// padHex is v in lower-case hex, zero-padded to width digits.
func padHex(v uint32, width int) string {
	h := strconv.FormatUint(uint64(v), 16)
	if len(h) < width {
		h = strings.Repeat("0", width-len(h)) + h
	}
	return h
}

// maxDepth bounds the nesting ReprJSON follows, as encoding/json bounds
// its own (a deeper document is refused there first).
const maxDepth = 10000

// ReprJSON is repr() of the value json.loads makes of doc: objects as
// dicts in the order their keys first appear (a repeated key keeps its
// first place and its last value, as a dict built pair by pair does),
// strings as WriteStringRepr, integers in full (any size), other numbers
// as floats (FloatRepr; beyond the float range inf), true, false and null
// as True, False and None. doc must be one JSON value.
func ReprJSON(doc []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var b strings.Builder
	if err := reprValue(&b, dec, 0); err != nil {
		return "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", errors.New("pyfmt: data after the JSON value")
	}
	return b.String(), nil
}

func reprValue(b *strings.Builder, dec *json.Decoder, depth int) error {
	if depth > maxDepth {
		return errors.New("pyfmt: JSON nested too deep")
	}
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("pyfmt: %w", err)
	}
	switch t := tok.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if t {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case string:
		WriteStringRepr(b, t)
	case json.Number:
		b.WriteString(numberRepr(string(t)))
	case json.Delim:
		switch t {
		case '[':
			b.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					b.WriteString(", ")
				}
				if err := reprValue(b, dec, depth+1); err != nil {
					return err
				}
			}
			b.WriteByte(']')
		case '{':
			// Values are printed into their own builders first: a repeated
			// key replaces the value at its first place.
			var keys []string
			vals := map[string]string{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return fmt.Errorf("pyfmt: %w", err)
				}
				k, ok := kt.(string)
				if !ok {
					return errors.New("pyfmt: an object key that is not a string")
				}
				var vb strings.Builder
				if err := reprValue(&vb, dec, depth+1); err != nil {
					return err
				}
				if _, seen := vals[k]; !seen {
					keys = append(keys, k)
				}
				vals[k] = vb.String()
			}
			b.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					b.WriteString(", ")
				}
				WriteStringRepr(b, k)
				b.WriteString(": ")
				b.WriteString(vals[k])
			}
			b.WriteByte('}')
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return fmt.Errorf("pyfmt: %w", err)
		}
	}
	return nil
}

// numberRepr is repr() of the number json.loads reads from a JSON
// number's text: an int when it has no fraction or exponent, else a float.
func numberRepr(s string) string {
	if !strings.ContainsAny(s, ".eE") {
		if s == "-0" {
			return "0"
		}
		return s
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil && math.IsInf(f, 1):
		return "inf"
	case err != nil && math.IsInf(f, -1):
		return "-inf"
	}
	return FloatRepr(f)
}
