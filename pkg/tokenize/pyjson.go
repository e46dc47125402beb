package tokenize

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/pkg/pyfmt"
)

// Python's json.dumps, as HuggingFace's chat templates call it through their
// tojson filter: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False) with the template's arguments. The
// template sees what json.loads made of the request: ints of any size,
// floats (whose text json.dumps prints as Python's repr: 2.0 stays 2.0,
// 1e16 becomes 1e+16), strings, and objects in the order the client sent.

// pyDumpOpts are json.dumps's arguments.
type pyDumpOpts struct {
	ensureASCII bool
	indent      *string // nil: one line
	itemSep     string
	keySep      string
	sortKeys    bool
}

// pyNumMark prefixes Python's own text of a number the template engine
// cannot hold or print as Python does, carried as a template string: an
// integer outside int64 (the engine's integers are int64; Python's are
// unbounded), and a float the engine would print differently from
// Python's repr (it prints 2.0 as "2"). tojson and trim print the text
// after the mark (output tags, string, join and '~' keep it: see
// pyPrint). Input strings starting with
// the mark are refused (jsonValue), and so is a rendered prompt still
// holding its first rune, the noncharacter U+FDD0 (the template printed
// the number some other way, perhaps changing the mark's letters, as upper
// would), so a number is printed as Python prints it or the request is
// refused: never silently different.
const pyNumMark = pyMarkRune + "py:"

// pyMarkRune is pyNumMark's first rune, U+FDD0, which no case mapping or
// other string filter changes.
const pyMarkRune = "\ufdd0"

// errNumberLeak: a template used such a number other than through tojson
// or trim.
var errNumberLeak = fmt.Errorf("%w: a number the template engine cannot print as Python was used outside tojson", ErrUnsupported)

// jsonNumberValue turns a JSON number into the value json.loads gives.
func jsonNumberValue(s string) (jinja.Value, error) {
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return jinja.NewInt(i), nil
		}
		if strings.Trim(strings.TrimPrefix(s, "-"), "0123456789") != "" {
			return jinja.Value{}, fmt.Errorf("bad number %q", s)
		}
		return jinja.NewString(pyNumMark + s), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return jinja.Value{}, fmt.Errorf("bad number %q", s)
	}
	if jinja.NewFloat(f).String() != pyfmt.FloatRepr(f) || math.IsInf(f, 0) {
		return jinja.NewString(pyNumMark + pyJSONFloat(f)), nil
	}
	return jinja.NewFloat(f), nil
}

// pyDumps appends the json.dumps text of v.
func pyDumps(sb *strings.Builder, v jinja.Value, o *pyDumpOpts, depth int) error {
	if depth > maxJSONDepth {
		return errors.New("tojson: nested too deeply")
	}
	switch {
	case v.IsUndefined():
		return errors.New("tojson: Undefined is not JSON serializable")
	case v.IsNone():
		sb.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case v.IsInt():
		var buf [24]byte
		sb.Write(strconv.AppendInt(buf[:0], v.AsInt(), 10))
	case v.IsFloat():
		sb.WriteString(pyJSONFloat(v.AsFloat()))
	case v.IsString():
		s := v.AsString()
		if text, ok := strings.CutPrefix(s, pyNumMark); ok {
			sb.WriteString(text)
			return nil
		}
		pyJSONString(sb, s, o.ensureASCII)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			o.newline(sb, depth+1)
			if err := pyDumps(sb, it, o, depth+1); err != nil {
				return err
			}
		}
		o.newline(sb, depth)
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if len(d.Keys) == 0 {
			sb.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = slices.Clone(keys)
			slices.Sort(keys) // Python compares str by code point, as Go compares UTF-8 bytes
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			o.newline(sb, depth+1)
			pyJSONString(sb, k, o.ensureASCII)
			sb.WriteString(o.keySep)
			if err := pyDumps(sb, d.Data[k], o, depth+1); err != nil {
				return err
			}
		}
		o.newline(sb, depth)
		sb.WriteByte('}')
	default:
		return fmt.Errorf("tojson: %s is not JSON serializable", v.String())
	}
	return nil
}

func (o *pyDumpOpts) newline(sb *strings.Builder, depth int) {
	if o.indent == nil {
		return
	}
	sb.WriteByte('\n')
	for range depth {
		sb.WriteString(*o.indent)
	}
}

// pyJSONFloat is float.__repr__ as json.dumps prints it (NaN and the
// infinities spelled the JavaScript way, as json.dumps does by default).
func pyJSONFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return pyfmt.FloatRepr(f)
}

const hexDigits = "0123456789abcdef"

// pyJSONString writes s as json.dumps quotes it: with ensure_ascii=False
// only '"', '\\' and the C0 controls are escaped (U+007F, U+2028 and
// U+2029 stay raw); with ensure_ascii=True everything outside ' '..'~' is
// escaped as \uXXXX (UTF-16 surrogate pairs above the BMP).
func pyJSONString(sb *strings.Builder, s string, ensureASCII bool) {
	sb.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			start := i
			for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' && s[i] != '\\' {
				i++
			}
			sb.WriteString(s[start:i])
			continue
		}
		if c < utf8.RuneSelf {
			i++
			switch c {
			case '"':
				sb.WriteString(`\"`)
			case '\\':
				sb.WriteString(`\\`)
			case '\n':
				sb.WriteString(`\n`)
			case '\r':
				sb.WriteString(`\r`)
			case '\t':
				sb.WriteString(`\t`)
			case '\b':
				sb.WriteString(`\b`)
			case '\f':
				sb.WriteString(`\f`)
			default:
				if c == 0x7f && !ensureASCII {
					sb.WriteByte(c)
				} else {
					writeU(sb, rune(c))
				}
			}
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		i += w
		switch {
		case !ensureASCII:
			sb.WriteRune(r)
		case r > 0xffff:
			r -= 0x10000
			writeU(sb, 0xd800+(r>>10))
			writeU(sb, 0xdc00+(r&0x3ff))
		default:
			writeU(sb, r)
		}
	}
	sb.WriteByte('"')
}

func writeU(sb *strings.Builder, r rune) {
	sb.WriteString(`\u`)
	sb.WriteByte(hexDigits[r>>12&15])
	sb.WriteByte(hexDigits[r>>8&15])
	sb.WriteByte(hexDigits[r>>4&15])
	sb.WriteByte(hexDigits[r&15])
}

// filterArg is a filter's argument given by keyword name, else at
// position pos (the value itself is position 0).
func filterArg(args []jinja.Value, kwargs map[string]jinja.Value, pos int, name string) (jinja.Value, bool) {
	if v, ok := kwargs[name]; ok {
		return v, true
	}
	if pos < len(args) {
		return args[pos], true
	}
	return jinja.Value{}, false
}

// pyTojson is the tojson filter of HuggingFace's template environment:
// tojson(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), arguments by position or keyword.
func pyTojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, errors.New("tojson: missing value")
	}
	arg := func(pos int, name string) (jinja.Value, bool) { return filterArg(args, kwargs, pos, name) }
	o := pyDumpOpts{itemSep: ", ", keySep: ": "}
	if v, ok := arg(1, "ensure_ascii"); ok {
		o.ensureASCII = v.IsTruthy()
	}
	if v, ok := arg(2, "indent"); ok && !v.IsNone() && !v.IsUndefined() {
		var pad string
		switch {
		case v.IsString():
			pad = v.AsString()
		case v.IsInt():
			pad = strings.Repeat(" ", int(max(0, min(v.AsInt(), 64))))
		default:
			return jinja.Value{}, errors.New("tojson: indent must be an int or a string")
		}
		o.indent = &pad
		o.itemSep = ","
	}
	if v, ok := arg(3, "separators"); ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Value{}, errors.New("tojson: separators must be two strings")
		}
		o.itemSep, o.keySep = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	if v, ok := arg(4, "sort_keys"); ok {
		o.sortKeys = v.IsTruthy()
	}
	var sb strings.Builder
	if err := pyDumps(&sb, args[0], &o, 0); err != nil {
		return jinja.Value{}, err
	}
	return jinja.NewString(sb.String()), nil
}

// pyIsSpace is Python's str.isspace for one code point: Unicode White_Space
// plus U+001C..U+001F (bidi class B or S), which str.strip() removes.
func pyIsSpace(r rune) bool {
	switch {
	case r < utf8.RuneSelf:
		return r == ' ' || r >= '\t' && r <= '\r' || r >= 0x1c && r <= 0x1f
	case r == 0x85 || r == 0xa0 || r == 0x1680 || r >= 0x2000 && r <= 0x200a,
		r == 0x2028 || r == 0x2029 || r == 0x202f || r == 0x205f || r == 0x3000:
		return true
	}
	return false
}

// pyTrim is Jinja's trim filter: str(value).strip(chars).
func pyTrim(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, errors.New("trim: missing value")
	}
	s, err := pyStr(args[0])
	if err != nil {
		return jinja.Value{}, err
	}
	chars, ok := filterArg(args, kwargs, 1, "chars")
	if ok && !chars.IsNone() && !chars.IsUndefined() {
		if !chars.IsString() {
			return jinja.Value{}, errors.New("trim: chars must be a string")
		}
		return jinja.NewString(strings.Trim(s, chars.AsString())), nil
	}
	return jinja.NewString(strings.TrimFunc(s, pyIsSpace)), nil
}

// pyStr is Python's str(v) for the values a template sees from a request
// (pyRepr's for a list or a dict). Undefined is "", as Jinja2 prints it; a
// callable is refused rather than printed differently from Python.
func pyStr(v jinja.Value) (string, error) {
	switch {
	case v.IsString():
		if text, ok := strings.CutPrefix(v.AsString(), pyNumMark); ok {
			return pyNumberStr(text), nil
		}
		return v.AsString(), nil
	case v.IsInt():
		return strconv.FormatInt(v.AsInt(), 10), nil
	case v.IsFloat():
		f := v.AsFloat()
		switch {
		case math.IsNaN(f):
			return "nan", nil
		case math.IsInf(f, 1):
			return "inf", nil
		case math.IsInf(f, -1):
			return "-inf", nil
		}
		return pyfmt.FloatRepr(f), nil
	case v.IsBool():
		if v.AsBool() {
			return "True", nil
		}
		return "False", nil
	case v.IsNone():
		return "None", nil
	case v.IsUndefined():
		return "", nil
	case v.IsList(), v.IsDict():
		var b strings.Builder
		if err := pyRepr(&b, v, 0); err != nil {
			return "", err
		}
		return b.String(), nil
	}
	return "", fmt.Errorf("%w: str() of a %s in a template", ErrUnsupported, pyTypeName(v))
}
