package extproc

import (
	"fmt"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
	"github.com/kvroute/kvroute/pkg/route"
)

// twoReplicas is a route.State of two healthy replicas without event
// streams (the approximate mode's fleet).
type twoReplicas struct{}

func (twoReplicas) Replicas() []route.Replica {
	return []route.Replica{
		{ID: "a", Address: "10.0.0.1:8000", Model: "m", BlockSize: 16},
		{ID: "b", Address: "10.0.0.2:8000", Model: "m", BlockSize: 16},
	}
}
func (twoReplicas) Load(index.ReplicaID) load.Load { return load.Load{Healthy: true} }
func (twoReplicas) Trust(index.ReplicaID) float64  { return 1 }
func (twoReplicas) EventFed(index.ReplicaID) bool  { return false }

// A router that leaves its records to the caller (route.Options.DeferRecords,
// as cmd/kvroute builds it) gets them written by the stream once its pick
// is answered: the next request finds the prefix it learned.
func TestStreamCommitsDeferredRecords(t *testing.T) {
	pol, err := policy.New(policy.NameKVRoute, policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	approx := route.NewApproxIndex(route.ApproxConfig{})
	rt := route.New(route.Options{Matcher: index.New(index.Config{}), State: twoReplicas{}, Policy: pol, Seed: 1, Approx: approx, DeferRecords: true})
	h := newHarness(t, Config{Decider: rt})
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = fmt.Sprint(1000 + i)
	}
	body := `{"model":"m","prompt":[` + strings.Join(ids, ",") + `]}`
	send := func() string {
		got := h.exchange(
			withMode(reqHeaders(false, ":path", "/v1/completions", "content-type", "application/json"),
				filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_NONE),
			reqBody(body, true))
		if len(got) != 2 || got[1].GetRequestBody().GetResponse().GetHeaderMutation() == nil {
			t.Fatalf("not routed: %v", summarize(got))
		}
		for _, hv := range got[1].GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if hv.GetHeader().GetKey() == "x-gateway-destination-endpoint" {
				return string(hv.GetHeader().GetRawValue())
			}
		}
		t.Fatal("no destination header")
		return ""
	}
	first := send()
	if st := approx.Stats(); st.Entries != 4 {
		t.Fatalf("after the first stream the approximate index holds %+v, want the prompt's 4 blocks", st)
	}
	for range 3 {
		if got := send(); got != first {
			t.Fatalf("the same prompt went to %s, then %s: the learned prefix was not used", first, got)
		}
	}
}
