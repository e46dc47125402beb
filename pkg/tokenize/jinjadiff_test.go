package tokenize

import (
	"encoding/json"
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

var updateJinjaDiff = flag.Bool("update-jinja-diff", false, "rewrite testdata/jinja_diff_known.txt from this run")

// TestJinjaDifferential renders the cases of testdata/jinja_diff_cases.json
// (one expression each, on one value; Jinja2's output recorded by
// hack/tokenizer-fixtures/gen_jinja_diff.py) as a chat template is
// compiled here. A case renders as Jinja2 does, or is refused (an error
// the caller falls back on), or fails in Python too, or is one of the
// engine's known divergences in testdata/jinja_diff_known.txt: what this
// package does not reproduce, listed so that a new one (a change here, an
// engine bump) fails and a fixed one is taken off the list (run with
// -update-jinja-diff to rewrite it).
func TestJinjaDifferential(t *testing.T) {
	raw, err := os.ReadFile("testdata/jinja_diff_cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Cases []struct{ Src, X, Want string }
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	var divergent []string
	same := 0
	for _, c := range ref.Cases {
		x, err := jsonValue(json.RawMessage(c.X))
		if err != nil {
			t.Fatalf("%s: %v", c.X, err)
		}
		tmpl, err := compileTemplate(c.Src)
		got := ""
		if err == nil {
			got, err = renderSafe(tmpl, map[string]jinja.Value{"x": x}, 0)
			if err == nil && strings.Contains(got, pyMarkRune) {
				err = errNumberLeak
			}
		}
		switch {
		case err != nil || strings.HasPrefix(c.Want, "ERR:"):
			// Refused here, or an error in Python: no prompt either way
			// that an engine would serve.
		case got == c.Want:
			same++
		default:
			divergent = append(divergent, c.Src+" with x = "+c.X)
		}
	}
	slices.Sort(divergent)
	const knownPath = "testdata/jinja_diff_known.txt"
	if *updateJinjaDiff {
		if err := os.WriteFile(knownPath, []byte(strings.Join(divergent, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(knownPath)
	if err != nil {
		t.Fatal(err)
	}
	known := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	for _, d := range divergent {
		if !slices.Contains(known, d) {
			t.Errorf("renders otherwise than Jinja2 and is not a known divergence: %s", d)
		}
	}
	for _, k := range known {
		if !slices.Contains(divergent, k) {
			t.Errorf("known divergence now renders as Jinja2 or is refused (take it off %s): %s", knownPath, k)
		}
	}
	if same < len(ref.Cases)/2 {
		t.Errorf("only %d of %d cases render as Jinja2", same, len(ref.Cases))
	}
	t.Logf("%d of %d as Jinja2, %d known divergences", same, len(ref.Cases), len(divergent))
}
