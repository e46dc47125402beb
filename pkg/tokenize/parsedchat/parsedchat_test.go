package parsedchat

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
)

func TestMessages(t *testing.T) {
	if got := Messages(nil); got != nil {
		t.Errorf("Messages(nil) = %v, want nil", got)
	}
	req, err := openai.Parse("/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}],"name":"n"},{"role":"assistant","content":"b"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []route.ChatMessage{
		{Role: "user", Content: "a", Name: "n", NonText: true, Raw: json.RawMessage(`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}],"name":"n"}`)},
		{Role: "assistant", Content: "b", Raw: json.RawMessage(`{"role":"assistant","content":"b"}`)},
	}
	if d := cmp.Diff(want, Messages(req.ChatMessages)); d != "" {
		t.Errorf("Messages (-want +got):\n%s", d)
	}
}
