package tokenize

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
	"golang.org/x/text/unicode/norm"
)

// Expected strings below are what CPython 3.11 prints (repr, json.dumps with
// ensure_ascii=False unless said otherwise, str.strip).

func renderWith(t *testing.T, src, jsonData string) (string, error) {
	t.Helper()
	if !jinjaFiltersReplaced {
		t.Fatal("the Jinja engine's filters were not replaced (engine layout changed?)")
	}
	tmpl, err := jinja.Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonValue(json.RawMessage(jsonData))
	if err != nil {
		return "", err
	}
	return renderSafe(tmpl, map[string]jinja.Value{"x": v}, 0)
}

func TestJinjaFiltersReplaced(t *testing.T) {
	const in = `{"b": [1, 2.0, {"z": null, "a": true}], "a": "\u00e9\u2028\ud83d\ude80\u007f\u001c\"\\"}`
	cases := []struct{ src, want string }{
		{`{{ x|tojson }}`, "{\"b\": [1, 2.0, {\"z\": null, \"a\": true}], \"a\": \"\u00e9\u2028\U0001f680\u007f\\u001c\\\"\\\\\"}"},
		{`{{ x|tojson(ensure_ascii=True) }}`, "{\"b\": [1, 2.0, {\"z\": null, \"a\": true}], \"a\": \"\\u00e9\\u2028\\ud83d\\ude80\\u007f\\u001c\\\"\\\\\"}"},
		{`{{ x|tojson(indent=2, sort_keys=True) }}`, "{\n  \"a\": \"\u00e9\u2028\U0001f680\u007f\\u001c\\\"\\\\\",\n  \"b\": [\n    1,\n    2.0,\n    {\n      \"a\": true,\n      \"z\": null\n    }\n  ]\n}"},
		{`{{ x|tojson(indent='\t', separators=[',', ':']) }}`, "{\n\t\"b\":[\n\t\t1,\n\t\t2.0,\n\t\t{\n\t\t\t\"z\":null,\n\t\t\t\"a\":true\n\t\t}\n\t],\n\t\"a\":\"\u00e9\u2028\U0001f680\u007f\\u001c\\\"\\\\\"\n}"},
		{`{{ x.b|tojson(false, 0) }}`, "[\n1,\n2.0,\n{\n\"z\": null,\n\"a\": true\n}\n]"},
	}
	for _, c := range cases {
		got, err := renderWith(t, c.src, in)
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.src, got, c.want)
		}
	}
	// Numbers keep Python's form: whole floats, exponents, big integers.
	got, err := renderWith(t, `{{ x|tojson }}`, `[2.0, -0.0, 1E+16, 1e-05, 12345678.9, 123456789012345678901234567890, -9223372036854775809, 9223372036854775807, 1e400, -0]`)
	if err != nil {
		t.Fatal(err)
	}
	if want := `[2.0, -0.0, 1e+16, 1e-05, 12345678.9, 123456789012345678901234567890, -9223372036854775809, 9223372036854775807, Infinity, 0]`; got != want {
		t.Errorf("numbers:\n got %s\nwant %s", got, want)
	}
	// trim is str.strip(): U+001C..U+001F, \v, \f, NEL and Unicode spaces go.
	got, err = renderWith(t, `[{{ x|trim }}|{{ x|trim('_') }}]`, `"\u0020\u001c\u001d hi \u001e\u001f\u000b\u0085\u3000"`)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[hi|\u0020\u001c\u001d hi \u001e\u001f\u000b\u0085\u3000]"; got != want {
		t.Errorf("trim: got %q, want %q", got, want)
	}
	got, err = renderWith(t, `{{ x|trim }}`, `2.0`)
	if err != nil || got != "2.0" {
		t.Errorf("trim of 2.0 = %q, %v", got, err)
	}
}

func TestNumbersOutsideTojsonAreRefused(t *testing.T) {
	cfg := `{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools|tojson }}"}`
	ct, err := ParseChatTemplate([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role": "user", "content": "hi"}]`)
	out, err := ct.Render(ChatInput{Messages: msgs, Tools: json.RawMessage(`[{"function": {"name": "n", "parameters": {"n": 123456789012345678901234567890, "f": 2.0}}}]`)})
	if err != nil || out != `hi[{"type": "function", "function": {"name": "n", "description": null, "parameters": {"n": 123456789012345678901234567890, "f": 2.0}}}]` {
		t.Fatalf("tojson path: %q, %v", out, err)
	}
	// The template prints the number directly, through string or join, or
	// with '~' or upper: refused, not printed. Python prints "2.0", but the
	// engine's own tests take the marked number for a string, so a branch
	// before the print may have gone another way than Python's.
	for _, src := range []string{`{{ t.function.parameters.f }}`, `{{ t.function.parameters.f|string }}`,
		`{{ [t.function.parameters.f]|join }}`, `{{ 'f=' ~ t.function.parameters.f }}`, `{{ t.function.parameters.f|upper }}`,
		`{{ [t.function.parameters.f] }}`} {
		ct2, err := ParseChatTemplate([]byte(`{"chat_template": "{% for t in tools %}` + src + `{% endfor %}"}`))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{`2.0`, `123456789012345678901234567890`} {
			tools := `[{"type": "function", "function": {"name": "n", "parameters": {"f": ` + f + `}}}]`
			if out, err := ct2.Render(ChatInput{Messages: msgs, Tools: json.RawMessage(tools)}); !errors.Is(err, ErrUnsupported) {
				t.Errorf("%s with f %s: %q, %v; want ErrUnsupported", src, f, out, err)
			}
		}
	}
	// 2.5 prints the same in both: rendered.
	ct2, err := ParseChatTemplate([]byte(`{"chat_template": "{% for t in tools %}{{ t.function.parameters.f }}{% endfor %}"}`))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := ct2.Render(ChatInput{Messages: msgs, Tools: json.RawMessage(`[{"type": "function", "function": {"name": "n", "parameters": {"f": 2.5}}}]`)}); err != nil || out != "2.5" {
		t.Errorf("2.5 printed directly: %q, %v", out, err)
	}
	// A string that looks like the internal mark is refused.
	bad := json.RawMessage(`[{"role": "user", "content": "` + pyNumMark + `1"}]`)
	if _, err := ct.Render(ChatInput{Messages: bad}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("marked input: err = %v, want ErrUnsupported", err)
	}
}

func TestBareStripRefusesWhereEngineDiffers(t *testing.T) {
	cfg := `{"chat_template": "{% for m in messages %}[{{ m.content.strip() }}]{% endfor %}"}`
	ct, err := ParseChatTemplate([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	out, err := ct.Render(ChatInput{Messages: json.RawMessage(`[{"role": "user", "content": "  hi \n"}]`)})
	if err != nil || out != "[hi]" {
		t.Fatalf("plain strip: %q, %v", out, err)
	}
	_, err = ct.Render(ChatInput{Messages: json.RawMessage(`[{"role": "user", "content": "\u001chi\u001f"}]`)})
	if !errors.Is(err, ErrUnsupported) {
		t.Errorf("strip() over U+001C: err = %v, want ErrUnsupported", err)
	}
	// strip with arguments is exact in the engine: not refused.
	cfg = `{"chat_template": "{% for m in messages %}[{{ m.content.strip('\\n') }}]{% endfor %}"}`
	ct, err = ParseChatTemplate([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := ct.Render(ChatInput{Messages: json.RawMessage(`[{"role": "user", "content": "\n\u001chi\n"}]`)}); err != nil || out != "[\u001chi]" {
		t.Errorf("strip('\\n'): %q, %v", out, err)
	}
}

func TestNFCWithoutStreamSafeInsertion(t *testing.T) {
	// 31 acute accents after "a": the first composes into U+00E1, the rest
	// stay; no U+034F anywhere.
	in := "a" + strings.Repeat("\u0301", 31)
	want := "\u00e1" + strings.Repeat("\u0301", 30)
	if got := nfc(in); got != want {
		t.Errorf("nfc: got %+q, want %+q", got, want)
	}
	// Canonical ordering across the 30-mark boundary: a below mark (ccc
	// 220) after 35 above marks (230) moves before them and composes with
	// the base (A + dot below = U+1EA0; U+1EA0 + grave has no composite).
	in = "A" + strings.Repeat("\u0300", 35) + "\u0323"
	want = "\u1ea0" + strings.Repeat("\u0300", 35)
	if got := nfc(in); got != want {
		t.Errorf("nfc reorder: got %+q, want %+q", got, want)
	}
	if got := nfc("e\u0301"); got != "\u00e9" {
		t.Errorf("nfc short: %+q", got)
	}
}

func TestUnicode16Categories(t *testing.T) {
	cases := []struct {
		r  rune
		gc uint8
	}{
		{'A', gcLu}, {'a', gcLl}, {'5', gcNd}, {' ', gcZs}, {0x16d70, gcNd}, {0x16d43, gcLo},
		{0x10d40, gcNd}, {0x116d0, gcNd}, {0x1cc00, gcSo}, {0x0378, gcCn}, {0x10ffff, gcCn}, {0xe000, gcCo},
		{0x0301, gcMn}, {0x2028, gcZl}, {0x2029, gcZp}, {0x3000, gcZs}, {0x85, gcCc},
	}
	for _, c := range cases {
		if got := gcOf(c.r); got != c.gc {
			t.Errorf("gcOf(%U) = %d, want %d", c.r, got, c.gc)
		}
	}
	if ucdVersion != "16.0.0" {
		t.Errorf("ucdVersion = %s", ucdVersion)
	}
}

// TestNFCASCIIPrefix: the ASCII fast path gives norm's NFC on random
// strings where ASCII runs of every length (around the 8-byte steps) meet
// combining marks, precomposed and decomposed letters, Hangul jamo and
// CJK.
func TestNFCASCIIPrefix(t *testing.T) {
	pool := []string{"a", "e", "Z", " ", "\n", "0123456", "abcdefgh", "\u0301", "\u0327", "\u0323\u0302", "\u00e9",
		"A\u030a", "\u1100", "\u1161", "\u11a8", "\uac00", "日本", "\U0001F680", "\u0f73", "\u0344"}
	rng := rand.New(rand.NewPCG(11, 12))
	for range 20000 {
		var b strings.Builder
		for n := rng.IntN(12); n > 0; n-- {
			b.WriteString(pool[rng.IntN(len(pool))])
		}
		s := b.String()
		if got, want := nfc(s), norm.NFC.String(s); got != want {
			t.Fatalf("nfc(%+q) = %+q, want %+q", s, got, want)
		}
	}
	for _, c := range []struct {
		s    string
		want int
	}{{"", 0}, {"abc", 3}, {"abcdefgh", 8}, {"abcdefghé", 8}, {"abcdefgé", 7}, {"é", 0}, {"abcdefghijklmnop\x80", 16}} {
		if got := asciiPrefix(c.s); got != c.want {
			t.Errorf("asciiPrefix(%q) = %d, want %d", c.s, got, c.want)
		}
	}
}

// TestNFCStableScan: nfc (its scan over ASCII and stable characters,
// norm for the runs between) gives norm's NFC on random strings of any
// code points, weighted towards the ones that are not stable (combining
// marks, Hangul jamo, compatibility and excluded characters), stable ones
// from every plane the table covers, characters above it and invalid
// bytes; and every stable character is in NFC by itself, a starter, and
// left alone by NFC after any of the characters that are not stable.
func TestNFCStableScan(t *testing.T) {
	var unstable []rune
	for r := rune(0x80); r < nfcStableLimit; r++ {
		if utf8.ValidRune(r) && !nfcStable(r) {
			unstable = append(unstable, r)
		}
	}
	if len(unstable) < 1000 || len(unstable) > 20000 {
		t.Fatalf("%d characters not stable", len(unstable))
	}
	table := nfcStableTable()
	for r := rune(0); r < nfcStableLimit; r++ {
		if table[r>>6]&(1<<(r&63)) != 0 != nfcStable(r) {
			t.Fatalf("table and nfcStable differ at %U", r)
		}
	}
	// No stable character is ever the second of a composition: every
	// character after the first in the canonical decomposition of a
	// character that NFC keeps (a primary composite: Hangul vowels and
	// trailing consonants included).
	seconds := 0
	for r := rune(0x80); r < nfcStableLimit; r++ { // no decomposition above U+2FA1D
		if !utf8.ValidRune(r) || !norm.NFC.IsNormalString(string(r)) {
			continue
		}
		d := []rune(norm.NFD.String(string(r)))
		for _, x := range d[1:] {
			seconds++
			if x < nfcStableLimit && nfcStable(x) {
				t.Fatalf("%U is stable but follows %U in the decomposition of %U", x, d[0], r)
			}
		}
	}
	if seconds < 2000 {
		t.Fatalf("only %d characters in decompositions", seconds)
	}
	rng := rand.New(rand.NewPCG(21, 22))
	randStable := func() rune {
		for {
			r := rng.Int32N(nfcStableLimit)
			if nfcStable(r) {
				return r
			}
		}
	}
	for range 3000 {
		r := randStable()
		if s := string(r); norm.NFC.String(s) != s || cccOf(r) != 0 {
			t.Fatalf("stable %U: not NFC by itself or not a starter", r)
		}
		x := unstable[rng.IntN(len(unstable))]
		if got, want := norm.NFC.String(string(x)+string(r)), norm.NFC.String(string(x))+string(r); got != want {
			t.Fatalf("%U then stable %U: NFC %+q, want %+q", x, r, got, want)
		}
	}
	for range 100000 {
		var b strings.Builder
		for n := 1 + rng.IntN(10); n > 0; n-- {
			switch k := rng.IntN(10); {
			case k < 4:
				b.WriteRune(unstable[rng.IntN(len(unstable))])
			case k < 7:
				b.WriteRune(randStable())
			case k < 9:
				b.WriteByte(byte(' ' + rng.IntN(95)))
			case rng.IntN(2) == 0:
				b.WriteRune(nfcStableLimit + rng.Int32N(utf8.MaxRune-nfcStableLimit))
			default:
				b.WriteByte(byte(0x80 + rng.IntN(0x80))) // invalid
			}
		}
		s := b.String()
		if got, want := nfc(s), norm.NFC.String(s); got != want {
			t.Fatalf("nfc(%+q) = %+q, want %+q", s, got, want)
		}
	}
}
