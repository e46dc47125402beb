package main

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"testing"
)

// Any body is parsed without panicking; what is rejected is a 400 with a
// vLLM error, never another failure.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt": "hi"}`, `{"prompt": ["a", "b"]}`, `{"prompt": [1, 2, 3]}`, `{"prompt": [[1], [2, 3]]}`,
		`{"prompt": [[1], "x"]}`, `{"prompt": [-1]}`, `{"prompt": {}}`, `{"messages": [{"role": "user", "content": "x"}]}`,
		`{"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url"}]}]}`,
		`{"messages": [{"content": 5}]}`, `[]`, `null`, `{"prompt": "x"} trailing`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req genRequest
		r := httptest.NewRequest("POST", "/v1/completions", bytes.NewReader(body))
		errs := []error{decodeBody(r, &req)}
		if errs[0] == nil {
			_, err := chatTokens(&req, nil)
			errs = append(errs, err)
			_, err = completionPrompts(&req, nil)
			errs = append(errs, err)
		}
		for _, err := range errs {
			var ae *apiError
			if err != nil && (!errors.As(err, &ae) || ae.status != 400) {
				t.Fatalf("error %v is not a 400", err)
			}
		}
	})
}
