//go:build vtprotobuf

package extproc

import (
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
)

// Built with the vtprotobuf tag (as the Makefile builds and tests), every
// answer goes through the generated encoder, whose bytes protobuf decodes
// back to the same message (the field order may differ from protobuf's
// own encoder: both are valid wire format). A go-control-plane upgrade
// that stopped generating the encoder fails here.
func TestAnswersUseGeneratedEncoder(t *testing.T) {
	for name, want := range answers() {
		m, ok := any(want).(vtMarshaler)
		if !ok {
			t.Fatalf("%s: %T has no generated encoder in this build", name, want)
		}
		out, err := marshalVT(m)
		if err != nil {
			t.Fatal(err)
		}
		got := new(extprocv3.ProcessingResponse)
		if err := proto.Unmarshal(out.Materialize(), got); err != nil || !proto.Equal(got, want) {
			t.Errorf("%s: decoded %v (%v), want %v", name, got, err, want)
		}
		out.Free()
	}
}
