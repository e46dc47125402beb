package parsedchat

import (
	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
)

// Messages converts decoded messages field for field; nil for none.
func Messages(ms []openai.Message) []route.ChatMessage {
	if len(ms) == 0 {
		return nil
	}
	out := make([]route.ChatMessage, len(ms))
	for i, m := range ms {
		out[i] = route.ChatMessage(m)
	}
	return out
}
