package pyfmt

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// Expected strings are what CPython 3.11 prints.

func TestFloatRepr(t *testing.T) {
	cases := []struct {
		f    float64
		want string
	}{
		{2.0, "2.0"}, {1.0, "1.0"}, {math.Copysign(0, -1), "-0.0"}, {0, "0.0"},
		{12345678.9, "12345678.9"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
		{1.5e16, "1.5e+16"}, {1e-5, "1e-05"}, {1e-4, "0.0001"}, {0.0001234, "0.0001234"},
		{1e-7, "1e-07"}, {1e300, "1e+300"}, {123456789012345678.0, "1.2345678901234568e+17"},
		{0.1, "0.1"}, {5e-324, "5e-324"}, {math.MaxFloat64, "1.7976931348623157e+308"},
		{-2.5e-10, "-2.5e-10"}, {100, "100.0"}, {1e22, "1e+22"}, {123456789, "123456789.0"},
		{9007199254740993, "9007199254740992.0"},
	}
	for _, c := range cases {
		if got := FloatRepr(c.f); got != c.want {
			t.Errorf("FloatRepr(%v) = %q, want %q", c.f, got, c.want)
		}
	}
}

// TestReprJSON: repr(json.loads(doc)) as CPython 3.11 printed it.
func TestReprJSON(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`[{"type": "text", "text": "it's \"x\""}, {"type": "image", "source": {"type": "url", "url": "u"}}]`, "[{'type': 'text', 'text': 'it\\'s \"x\"'}, {'type': 'image', 'source': {'type': 'url', 'url': 'u'}}]"},
		{`{"a": 1, "b": 2, "a": 3}`, "{'a': 3, 'b': 2}"},
		{`[1, -0, -0.0, 2.0, 1e16, 1E5, 1e400, -1e400, 123456789012345678901234567890, 0.1, 1.5e-7]`, "[1, 0, -0.0, 2.0, 1e+16, 100000.0, inf, -inf, 123456789012345678901234567890, 0.1, 1.5e-07]"},
		{`[true, false, null, "", "tab\there\nnew\r", "\u00e9\u00a0\u2028\ud83d\ude80\u007f\u001c\u00ad\\"]`, "[True, False, None, '', 'tab\\there\\nnew\\r', 'é\\xa0\\u2028🚀\\x7f\\x1c\\xad\\\\']"},
		{`["only \" double", "both ' and \"", "it's"]`, "['only \" double', 'both \\' and \"', \"it's\"]"},
		{`{"nested": {"list": [[], {}], "k": [{"x": null}]}}`, "{'nested': {'list': [[], {}], 'k': [{'x': None}]}}"},
		{`"a plain string"`, "'a plain string'"},
	} {
		got, err := ReprJSON([]byte(c.doc))
		if err != nil || got != c.want {
			t.Errorf("ReprJSON(%s)\n got %q, %v\nwant %q", c.doc, got, err, c.want)
		}
	}
	for _, bad := range []string{``, `[1,`, `{"a" 1}`, `1 2`, strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2)} {
		if got, err := ReprJSON([]byte(bad)); err == nil {
			t.Errorf("ReprJSON(%.20q) = %q, want an error", bad, got)
		}
	}
}

// FuzzReprJSON: any input is printed or refused without a panic, and every
// JSON document encoding/json accepts is printed.
func FuzzReprJSON(f *testing.F) {
	for _, s := range []string{`[{"a": "it's \"x\"", "b": [1, 2.0, null, true]}]`, `{"a": 1, "a": 2}`, `"\ud800"`, `1e400`, `[`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		out, err := ReprJSON(doc)
		if json.Valid(doc) && err != nil {
			t.Fatalf("valid JSON %q refused: %v", doc, err)
		}
		if err == nil && out == "" {
			t.Fatalf("%q printed as nothing", doc)
		}
	})
}
