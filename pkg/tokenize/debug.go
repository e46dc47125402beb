package tokenize

import (
	"encoding/json"
	"net/http"
	"sort"
)

// ModelDebug is one configured model's tokenizer as GET /debug/tokenizer
// shows it.
type ModelDebug struct {
	Model     string          `json:"model"`
	Kind      Kind            `json:"kind"`
	Explain   string          `json:"explain"`
	SelfCheck *SelfCheckState `json:"self_check,omitempty"`
}

// Debug returns every configured model's tokenizer, and every model the
// default tokenizer served so far, with its explanation and its self-check
// state, sorted by model.
func (t *Tokenizer) Debug() []ModelDebug {
	all := make(map[string]*modelTokenizer, len(t.models))
	if t.defaults != nil {
		t.defaults.mu.Lock()
		for name, m := range t.defaults.m {
			all[name] = m
		}
		t.defaults.mu.Unlock()
	}
	for name, m := range t.models {
		all[name] = m
	}
	out := make([]ModelDebug, 0, len(all))
	for name, m := range all {
		d := ModelDebug{Model: name, Kind: m.cfg.Kind, Explain: t.Explain(name)}
		if m.checked() {
			st := m.selfCheckState()
			d.SelfCheck = &st
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// DebugHandler serves Debug as JSON ({"models": [...]}).
func (t *Tokenizer) DebugHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(map[string]any{"models": t.Debug()})
	})
}
