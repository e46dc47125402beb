package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

// refJSONValue is the decoder jsonValue replaced: encoding/json's token
// stream, the reference the scanner is held to.
func refJSONValue(raw []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := refDecodeValue(dec, 0)
	if err != nil {
		return jinja.Value{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Value{}, errors.New("trailing data after JSON value")
	}
	return v, nil
}

func refDecodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Value{}, errors.New("JSON nested too deeply")
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			out := jinja.NewDict()
			d := out.AsDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Value{}, err
				}
				k, ok := kt.(string)
				if !ok {
					return jinja.Value{}, errors.New("object key is not a string")
				}
				v, err := refDecodeValue(dec, depth+1)
				if err != nil {
					return jinja.Value{}, err
				}
				d.Set(k, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Value{}, err
			}
			return out, nil
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := refDecodeValue(dec, depth+1)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Value{}, err
			}
			return jinja.NewList(items), nil
		}
		return jinja.Value{}, fmt.Errorf("unexpected %v", t)
	case string:
		if strings.HasPrefix(t, pyNumMark) {
			return jinja.Value{}, fmt.Errorf("%w: string starting with U+FDD0", ErrUnsupported)
		}
		return jinja.NewString(t), nil
	case json.Number:
		return jsonNumberValue(string(t))
	case bool:
		return jinja.NewBool(t), nil
	case nil:
		return jinja.None(), nil
	}
	return jinja.Value{}, fmt.Errorf("unexpected JSON token %v", tok)
}

// sameJSONValue compares two decoded values: kinds, scalars, key order.
func sameJSONValue(a, b jinja.Value) bool {
	switch {
	case a.IsDict() && b.IsDict():
		da, db := a.AsDict(), b.AsDict()
		if len(da.Keys) != len(db.Keys) {
			return false
		}
		for i, k := range da.Keys {
			if db.Keys[i] != k || !sameJSONValue(da.Data[k], db.Data[k]) {
				return false
			}
		}
		return true
	case a.IsList() && b.IsList():
		la, lb := a.AsList().Items, b.AsList().Items
		if len(la) != len(lb) {
			return false
		}
		for i := range la {
			if !sameJSONValue(la[i], lb[i]) {
				return false
			}
		}
		return true
	case a.IsDict() || b.IsDict() || a.IsList() || b.IsList():
		return false
	}
	kind := func(v jinja.Value) string {
		return fmt.Sprint(v.IsNone(), v.IsBool(), v.IsInt(), v.IsFloat(), v.IsString())
	}
	if a.IsString() && b.IsString() {
		return a.AsString() == b.AsString()
	}
	return kind(a) == kind(b) && a.String() == b.String()
}

var jsonCases = []string{
	`null`, `true`, `false`, `0`, `-0`, `-0.0`, `1e5`, `1E+2`, `2.50`, `123456789012345678901234567890`, `1e400`, `5e-324`,
	`""`, `"plain"`, `"esc \" \\ \/ \b \f \n \r \t"`, `"\u00e9\ud83d\ude00"`, `"lone \ud800 x"`, `"\ud800\ud800"`, `"\ud800\u0041"`,
	`"\udc00"`, `"bad \xff utf8 \xc3"`, "\"\xed\xa0\x80\"", `"\u0000"`, `"\ufdd0py:1"`, `"x\ufdd0"`,
	`[]`, ` [ ] `, `{}`, `[1,[2,[3]],{"a":{}}]`, `{"b":1,"a":2,"b":3}`, `{"k":"v","n":null,"l":[true,false]}`,
	"\t{\r\n\"a\" : [ 1 , 2 ] }\n",
	// Refused.
	``, ` `, `nul`, `tru`, `01`, `1.`, `.5`, `-`, `1e`, `1e+`, `+1`, `[1,]`, `[,1]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`,
	`{"a":1} x`, `[1] [2]`, `"unterminated`, "\"ctl \x01\"", `"bad \x escape"`, `"\u12"`, `"\uZZZZ"`, `"\ud800\uZZZZ"`,
	`[` + strings.Repeat(`[`, 250) + strings.Repeat(`]`, 251), `{"a":`, `NaN`, `Infinity`,
}

func checkJSONValue(t *testing.T, raw []byte) {
	t.Helper()
	got, err := jsonValue(raw)
	want, werr := refJSONValue(raw)
	if (err != nil) != (werr != nil) {
		t.Fatalf("%q: scanner error %v, encoding/json error %v", raw, err, werr)
	}
	if err != nil {
		if errors.Is(err, ErrUnsupported) != errors.Is(werr, ErrUnsupported) {
			t.Fatalf("%q: scanner error %v, encoding/json error %v", raw, err, werr)
		}
		return
	}
	if !sameJSONValue(got, want) {
		t.Fatalf("%q: scanner %s, encoding/json %s", raw, got.String(), want.String())
	}
}

func TestJSONValueAsEncodingJSON(t *testing.T) {
	for _, c := range jsonCases {
		checkJSONValue(t, []byte(c))
	}
}

func FuzzJSONValue(f *testing.F) {
	for _, c := range jsonCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkJSONValue(t, raw)
	})
}
