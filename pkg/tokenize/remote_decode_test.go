package tokenize

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestParseTokenizeResponseMatchesEncodingJSON: the hand-written decoder
// accepts and refuses what encoding/json does for /tokenize answers, with
// the same ids and count (escaped keys, extra members of every JSON kind,
// white space, duplicates, bad ids and trailing garbage included).
func TestParseTokenizeResponseMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	var big strings.Builder
	big.WriteString(`{"count":5000,"max_model_len":40960,"tokens":[`)
	for i := range 5000 {
		if i > 0 {
			big.WriteByte(',')
		}
		fmt.Fprint(&big, rng.Uint32N(200_000))
	}
	big.WriteString(`],"token_strs":null}`)
	cases := []string{
		big.String(),
		`{"count":3,"max_model_len":4096,"tokens":[1,2,3]}`,
		`  { "tokens" : [ 0 , 4294967295 ] , "count" : 2 }  `,
		`{"tokens":[]}`,
		`{"t\u006fkens":[7,8]}`,
		`{"extra":{"a":[1,{"b":"x\"y"}],"c":null,"d":true,"e":-1.5e3},"tokens":[5],"more":"\u00e9"}`,
		`{"tokens":[1],"tokens":[2,3]}`,
		`{"tokens":null}`,
		`{}`,
		`{"tokens":[4294967296]}`,
		`{"tokens":[-1]}`,
		`{"tokens":[1.0]}`,
		`{"tokens":[1e3]}`,
		`{"tokens":[01]}`,
		`{"tokens":["1"]}`,
		`{"tokens":{"a":1}}`,
		`{"tokens":[1,]}`,
		`{"tokens":[1 2]}`,
		`{"tokens":[1]`,
		`{"tokens":[1]} x`,
		`{"count":"3","tokens":[1]}`,
		`{"count":1.5,"tokens":[1]}`,
		`{"bad":tru,"tokens":[1]}`,
		`{"bad":"a` + "\x01" + `b","tokens":[1]}`,
		`{"bad":[1,2,"tokens":[1]}`,
		`[1,2]`,
		``,
		`{"tokens":[1],}`,
		`{tokens:[1]}`,
	}
	for _, c := range cases {
		var want tokenizeResponse
		wantErr := json.Unmarshal([]byte(c), &want)
		got, gotErr := parseTokenizeResponse([]byte(c))
		name := c
		if len(name) > 60 {
			name = name[:60] + "..."
		}
		if (wantErr == nil) != (gotErr == nil) {
			t.Errorf("%s: encoding/json err %v, parser err %v", name, wantErr, gotErr)
			continue
		}
		if wantErr == nil && (got.Count != want.Count || !slices.Equal(got.Tokens, want.Tokens) || (got.Tokens == nil) != (want.Tokens == nil)) {
			t.Errorf("%s: got %d %v, want %d %v", name, got.Count, got.Tokens, want.Count, want.Tokens)
		}
	}
}

func BenchmarkParseTokenizeResponse(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"count":60000,"max_model_len":131072,"tokens":[`)
	for i := range 60000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, (i*7919)%151000)
	}
	sb.WriteString(`],"token_strs":null}`)
	data := []byte(sb.String())
	for _, mode := range []string{"encoding-json", "parser"} {
		b.Run(mode, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				var out tokenizeResponse
				var err error
				if mode == "parser" {
					out, err = parseTokenizeResponse(data)
				} else {
					err = json.Unmarshal(data, &out)
				}
				if err != nil || len(out.Tokens) != 60000 {
					b.Fatal(err)
				}
			}
		})
	}
}
